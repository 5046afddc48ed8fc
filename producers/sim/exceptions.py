"""Errors raised by the simulation core. Each names the scenario, field, file or model at fault."""


class SimError(Exception):
    """Root of every simulation-core error."""


class EnvError(SimError):
    """The simulator failed to build, reset or step a scenario (physics or model trouble)."""


class ActionError(SimError, ValueError):
    """An action of the wrong shape or with non-finite values."""


class KeyframeError(SimError):
    """An offscreen keyframe could not be rendered (no GL backend, env built without keyframes)."""


class ModelConfigError(SimError, ValueError):
    """A models.yaml entry that is missing a key or has a bad value; names the file and entry."""


class UnknownPolicy(SimError, KeyError):
    """A policy kind or model id that is not registered."""
