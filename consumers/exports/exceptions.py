"""Errors of the hard-case exports."""


class ExportError(Exception):
    """Root of every export error."""


class NothingToExport(ExportError):
    """No episode matched the filters (the message says which filters)."""


class IncompatibleEpisodes(ExportError):
    """The episodes cannot share one LeRobot dataset (different action or state sizes, image shapes)."""


class OutputExists(ExportError):
    """The output directory already holds a dataset; exports never overwrite one."""
