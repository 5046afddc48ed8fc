"""Errors raised by the mutation operators and their chooser. Each names the cluster, scenario or
value at fault."""

from streams.exceptions import StreamsError


class MutationError(StreamsError):
    """Root of every mutation error."""


class SeedError(MutationError, ValueError):
    """A failure seed (a ClusterUpdated dict) the operators cannot use; names the cluster and field."""


class OperatorError(MutationError, ValueError):
    """An operator asked for something it does not do (an unknown operator or variant, a variant
    the parent's task has no meaning for); quotes the name."""


class CompositionError(MutationError, ValueError):
    """Promoted scenarios that cannot be composed (different bases, the same field set twice)."""
