"""Errors of the critics. Each names the value or input at fault."""


class CriticError(Exception):
    """Root of every critic error."""


class ConfigError(CriticError, ValueError):
    """A critic configuration value out of its documented range; quotes the value."""


class CriticInputError(CriticError, ValueError):
    """Data given to a critic that it cannot reason about (wrong types, unequal arms, missing frame)."""
