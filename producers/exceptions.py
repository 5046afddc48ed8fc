"""Errors raised where events are produced."""


class ProducerError(Exception):
    """Root of every producer-side error."""


class PublishError(ProducerError):
    """The broker did not acknowledge every published event; names the first failures."""


class SignalError(ProducerError, ValueError):
    """A step's signals break the recorder's contract (producers/recorder.py); names the field."""


class EpisodeConflict(ProducerError):
    """A different episode under an episode id already recorded in this process; set the identity's variant."""
