"""Errors raised by the LIBERO benchmark's scenarios, tasks, environments and worker."""

from producers.exceptions import ProducerError


class LiberoError(ProducerError):
    """Root of every LIBERO-side error."""


class LiberoTaskError(LiberoError, KeyError):
    """A suite or task is not part of the installed LIBERO, or its files cannot be read."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class LiberoEnvError(LiberoError):
    """The LIBERO simulation could not be built, reset or stepped."""


class LiberoSetupMissing(LiberoError):
    """LIBERO is not importable here: this process does not run in the LIBERO venv."""
