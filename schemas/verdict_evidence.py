"""The robustness critic's evidence, typed: what a robustness CriticVerdict's ``evidence_json`` holds.

    evidence = RobustnessEvidence.from_json(v.evidence_json, verdict=v.event_id)   # else InvalidEvidence
    evidence.seeds_per_arm, evidence.models["weak"].candidate_successes, evidence.borderline
    evidence.to_json()        # the verdict's evidence_json: sorted keys, no spaces

Written by the robustness critic (consumers/critics/sequential.py builds it, Decision.evidence; the
critics worker marks a borderline one with dataclasses.replace(evidence, borderline=True) and
encodes it with to_json), read by the promotion gate (streams/gate/agent.py decodes it once, where
it builds GateState). The JSON keys are the field names.

Keys:
- required: ``action`` (the sequential rule's: accept | reject), ``seeds_per_arm``, ``models``
  (model id -> ModelEvidence) and ``checks`` (check name -> the rule's CheckResult as a JSON object:
  the gate copies them into its decision's checks_json, a reviewer reads them);
- ``borderline``: written only when true (the worker's marking); absent, false;
- the rule's trace: ``rule``, ``look``, ``next_seeds``, ``unused_seeds``, ``reason``,
  ``oracle_successes``, ``rollouts``, ``history`` and ``config``. The robustness critic writes all of
  them (``next_seeds`` is null in every verdict: only a decided candidate gets one); a verdict written
  by hand (a test's stand-in) may leave all of them out, never some. Absent, they are None here and
  stay absent in to_json.
Per model: ``candidate_successes`` is required; ``parent_successes``, ``parent_only`` and
``candidate_only`` come all three or not at all. Any other key is an error, so a renamed key shows
as the one missing and the one unexpected. The safety and semantic critics' evidence has no record:
the gate reads nothing of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.exceptions import InvalidEvidence

REQUIRED = ("action", "seeds_per_arm", "models", "checks")
TRACE = ("rule", "look", "next_seeds", "unused_seeds", "reason", "oracle_successes", "rollouts", "history",
         "config")
PAIRED = ("parent_successes", "parent_only", "candidate_only")


@dataclass(frozen=True, kw_only=True)
class ModelEvidence:
    """A registered model's counts over the verdict's ``seeds_per_arm`` seeds (sequential.ModelCounts)."""

    candidate_successes: int
    parent_successes: int | None = None
    parent_only: int | None = None  # seeds where the parent succeeded and the candidate failed
    candidate_only: int | None = None  # the reverse

    def __post_init__(self) -> None:
        _count(self.candidate_successes, "candidate_successes")
        given = [n for n in PAIRED if getattr(self, n) is not None]
        if given and len(given) < len(PAIRED):
            _incomplete(PAIRED, given, None)
        for name in given:
            _count(getattr(self, name), name)

    @property
    def paired(self) -> bool:
        """Whether the parent arm's counts are given (the critic always gives them)."""
        return self.parent_successes is not None

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"candidate_successes": self.candidate_successes}
        if self.paired:
            out |= {n: getattr(self, n) for n in PAIRED}
        return out

    @classmethod
    def from_dict(cls, value: object, path: str = "") -> ModelEvidence:
        """``path``: where the counts sit in the record (``models.<id>``), for the error's key."""
        if not isinstance(value, Mapping):
            raise InvalidEvidence(f"must be a JSON object, got {_show(value)}", key=path or None)
        try:
            _keys(value, ("candidate_successes",), PAIRED, None)
            _group(value, PAIRED, None)
            _not_null(value, PAIRED)
            return cls(**value)
        except InvalidEvidence as exc:
            key = f"{path}.{exc.key}" if path and exc.key else path or exc.key
            raise InvalidEvidence(exc.problem, key=key, critic=exc.critic) from None


@dataclass(frozen=True, kw_only=True)
class RobustnessEvidence:
    """The sequential rule's account of a decided candidate (consumers/critics/sequential.py).

    Built and read as it is, never changed: ``dataclasses.replace`` makes a new one (the worker's
    borderline marking). The containers are plain dicts and lists (what json gives), not to be mutated.
    """

    action: str  # accept | reject (the rule's, before the worker's borderline marking)
    seeds_per_arm: int  # seeds per arm the decision used
    models: Mapping[str, ModelEvidence]
    checks: Mapping[str, Mapping[str, Any]]  # check name -> CheckResult fields
    borderline: bool = False  # undecided at the last look, every test near its level: a person decides
    # the rule's trace: all given, or (a hand-written verdict) none
    rule: str | None = None  # the critic's version, e.g. robustness-sequential/1.0
    look: int | None = None
    next_seeds: int | None = None  # null in a verdict (decided); written whenever the trace is
    unused_seeds: int | None = None
    reason: str | None = None
    oracle_successes: int | None = None
    rollouts: Mapping[str, Any] | None = None  # candidate, control, total, per_model
    history: tuple[Mapping[str, Any], ...] | None = None  # every look replayed: {look, seeds, checks}
    config: Mapping[str, Any] | None = None  # the SequentialConfig, as asdict gives it

    def __post_init__(self) -> None:
        put = object.__setattr__
        _text(self.action, "action")
        _count(self.seeds_per_arm, "seeds_per_arm")
        if not isinstance(self.models, Mapping):
            raise InvalidEvidence(f"must be a JSON object, got {_show(self.models)}", key="models")
        for model, counts in self.models.items():
            if not isinstance(model, str) or not model:
                raise InvalidEvidence(f"must be keyed by non-empty model ids, got {model!r}", key="models")
            if not isinstance(counts, ModelEvidence):
                raise InvalidEvidence(f"must be a ModelEvidence, got {_show(counts)}", key=f"models.{model}")
            for name, n in counts.to_dict().items():
                if n > self.seeds_per_arm:
                    raise InvalidEvidence(f"must be at most seeds_per_arm ({self.seeds_per_arm}), got {n}",
                                          key=f"models.{model}.{name}")
        put(self, "models", dict(self.models))
        checks = _object(self.checks, "checks")
        for name, check in checks.items():
            if not isinstance(check, dict):
                raise InvalidEvidence(f"must be a JSON object, got {_show(check)}", key=f"checks.{name}")
        put(self, "checks", checks)
        if not isinstance(self.borderline, bool):
            raise InvalidEvidence(f"must be true or false, got {_show(self.borderline)}", key="borderline")
        given = [n for n in TRACE if n != "next_seeds" and getattr(self, n) is not None]
        if not given:
            if self.next_seeds is not None:
                raise InvalidEvidence("is given without the rest of the rule's trace", key="next_seeds")
            return
        if len(given) < len(TRACE) - 1:
            _incomplete([n for n in TRACE if n != "next_seeds"], given, None)
        _text(self.rule, "rule")
        _text(self.reason, "reason")
        for name in ("look", "unused_seeds", "oracle_successes"):
            _count(getattr(self, name), name)
        if self.next_seeds is not None:
            _count(self.next_seeds, "next_seeds")
        put(self, "rollouts", _object(self.rollouts, "rollouts"))
        put(self, "config", _object(self.config, "config"))
        if not isinstance(self.history, list | tuple):
            raise InvalidEvidence(f"must be a JSON array, got {_show(self.history)}", key="history")
        put(self, "history", tuple(_object(h, f"history[{i}]") for i, h in enumerate(self.history)))

    @property
    def traced(self) -> bool:
        """Whether the rule's trace is given (the critic always gives it)."""
        return self.rule is not None

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"action": self.action, "seeds_per_arm": self.seeds_per_arm,
                               "models": {m: c.to_dict() for m, c in self.models.items()}, "checks": self.checks}
        if self.borderline:
            out["borderline"] = True
        if self.traced:
            out |= {n: getattr(self, n) for n in TRACE} | {"history": list(self.history)}
        return out

    def to_json(self) -> str:
        """The verdict's evidence_json, byte for byte what the critics worker has always written."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, value: object, verdict: str | None = None) -> RobustnessEvidence:
        """``verdict``: the CriticVerdict's event id, named by the error."""
        try:
            if not isinstance(value, Mapping):
                raise InvalidEvidence(f"must be a JSON object, got {_show(value)}")
            _keys(value, REQUIRED, ("borderline", *TRACE), None)
            _group(value, TRACE, None)
            _not_null(value, [n for n in TRACE if n != "next_seeds"])
            models = value["models"]
            if not isinstance(models, Mapping):
                raise InvalidEvidence(f"must be a JSON object, got {_show(models)}", key="models")
            return cls(**{**value, "models": {m: ModelEvidence.from_dict(c, f"models.{m}") for m, c in models.items()}})
        except InvalidEvidence as exc:
            if verdict is None:
                raise
            raise exc.of_verdict(verdict) from None

    @classmethod
    def from_json(cls, text: str | None, verdict: str | None = None) -> RobustnessEvidence:
        if not text:
            raise InvalidEvidence("is empty", verdict=verdict)
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise InvalidEvidence(f"is not JSON ({exc})", verdict=verdict) from None
        return cls.from_dict(value, verdict)


# -- checks ------------------------------------------------------------------------------------

def _keys(value: Mapping, required: tuple[str, ...], optional: tuple[str, ...], path: str | None) -> None:
    known = (*required, *optional)
    missing = [k for k in required if k not in value]
    unexpected = sorted(str(k)[:60] for k in value if k not in known)  # clipped: they end up in a reason
    if missing:
        instead = f" (it has {', '.join(map(repr, unexpected))} instead: renamed?)" if unexpected else ""
        raise InvalidEvidence(f"is missing{instead}", key=_at(path, missing[0]))
    if unexpected:
        raise InvalidEvidence(f"is not one of its keys ({', '.join(sorted(known))})", key=_at(path, unexpected[0]))


def _group(value: Mapping, group: tuple[str, ...], path: str | None) -> None:
    given = [k for k in group if k in value]
    if given and len(given) < len(group):
        _incomplete(group, given, path)


def _incomplete(group, given, path: str | None):
    missing = next(k for k in group if k not in given)
    raise InvalidEvidence(f"is missing (given: {', '.join(given)}; these come all together or not at all)",
                          key=_at(path, missing))


def _not_null(value: Mapping, names) -> None:
    for name in names:
        if name in value and value[name] is None:
            raise InvalidEvidence("must not be null", key=name)


def _count(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidEvidence(f"must be an integer >= 0, got {_show(value)}", key=key)
    return value


def _text(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise InvalidEvidence(f"must be a string, got {_show(value)}", key=key)
    return value


def _object(value: object, key: str) -> dict:
    if not isinstance(value, Mapping):
        raise InvalidEvidence(f"must be a JSON object, got {_show(value)}", key=key)
    return _plain(value, key)


def _plain(value: object, key: str) -> Any:
    """The value as json.loads would give it back (dicts, lists, scalars), or InvalidEvidence."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidEvidence(f"must have string keys, got {k!r}", key=key)
            out[k] = _plain(v, f"{key}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [_plain(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, str | int | float):
        return value
    raise InvalidEvidence(f"must be a JSON value, got {type(value).__name__}", key=key)


def _at(path: str | None, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
