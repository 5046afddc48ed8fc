"""Errors raised by the schema layer. Each names the event type, schema id or field at fault."""

from __future__ import annotations


class SchemaError(Exception):
    """Root of every schema-layer error."""


class UnknownEventType(SchemaError):
    """An event type that has no schema in schemas/avro."""


class UnknownSchemaId(SchemaError):
    """A framed message whose schema id is not in the manifest or the registry."""


class DecodeError(SchemaError):
    """Bytes that are not a valid Confluent-framed Avro event."""


class InvalidEvent(SchemaError):
    """A value that does not match its event type's schema."""


class ScenarioError(SchemaError, ValueError):
    """A robosuite scenario field with a value the simulator cannot build; quotes the field and value."""


class LiberoScenarioError(ScenarioError):
    """A LIBERO scenario (suite, task, init state, perturbations) is invalid; names the bad value."""


class InvalidEvidence(SchemaError):
    """A CriticVerdict's evidence_json that does not match its record (schemas/verdict_evidence.py).

    ``key`` is the key at fault as a path ("seeds_per_arm", "models.weak.candidate_successes"; None
    when the text is not a JSON object at all), ``verdict`` the CriticVerdict's event id when known,
    ``problem`` what is wrong with it.
    """

    def __init__(self, problem: str, *, key: str | None = None, verdict: str | None = None,
                 critic: str = "robustness"):
        self.problem, self.key, self.verdict, self.critic = problem, key, verdict, critic
        of = f" of verdict {verdict}" if verdict else ""
        super().__init__(f"{critic} evidence{of}: " + (f"key {key!r} {problem}" if key else problem))

    def of_verdict(self, verdict: str | None) -> InvalidEvidence:
        """The same error, naming the verdict whose evidence it is."""
        return InvalidEvidence(self.problem, key=self.key, verdict=verdict, critic=self.critic)


class ManifestOutdated(SchemaError):
    """A schema changed without a new version in schemas/manifest.json."""


class IncompatibleSchema(SchemaError):
    """A new schema version cannot read data written with an older one."""
