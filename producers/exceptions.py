"""Errors raised where events are produced."""


class ProducerError(Exception):
    """Root of every producer-side error."""


class PublishError(ProducerError):
    """The broker did not acknowledge every published event; names the first failures."""
