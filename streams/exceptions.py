"""Errors raised by the stream processors. Each names the episode, topic or value at fault."""


class StreamsError(Exception):
    """Root of every stream-processor error."""


class ConfigError(StreamsError, ValueError):
    """A stream-processor configuration value out of its documented range; quotes the value."""


class DetectorError(StreamsError):
    """An event the failure detector cannot reason about (wrong episode, malformed signal)."""


class ClustererError(StreamsError):
    """The failure clusterer was given inconsistent input (wrong embedding size, unknown id)."""


class SummaryError(StreamsError):
    """A cluster summary could not be produced by the configured language model."""
