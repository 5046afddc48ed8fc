"""Errors of the evidence store and the sink."""


class EvidenceError(Exception):
    """Root of every evidence-store error."""


class StoreUnavailable(EvidenceError):
    """The store cannot be opened or reached (chDB directory held by another process, server down)."""


class StoreQueryError(EvidenceError):
    """ClickHouse rejected a statement; carries the statement's first line."""


class MigrationError(EvidenceError):
    """A migration file is malformed or was changed after it was applied."""


class ConsumerFailed(EvidenceError):
    """The sink's Kafka consumer reported an error it was told not to carry on from."""


class ReplayError(EvidenceError):
    """A rebuild cannot read the topics: the broker unreachable, a topic missing, a consumer error."""
