"""`python -m infra.cli` is `sepa-eval`."""

from infra.cli import app

app()
