"""The `sepa-eval` command line.

Usage:
    sepa-eval up                 # embedded broker, pipeline, streams and rollout workers in the background
    sepa-eval run                # the whole loop, on the embedded default
    sepa-eval status [--json]    # processes, topics and evidence counts
    sepa-eval rollout --model oracle --episodes 5   # served by the rollout worker `up` started
    sepa-eval synth --episodes 100 --steps 200 --seed 7
    sepa-eval replay --verify    # rebuild the store from the topics; exit 1 if the state differs
    sepa-eval replay --republish # store -> a private broker's topics -> a rebuilt store
    sepa-eval report --output eval_memory/report.md
    sepa-eval eval --model scripted-expert --ci   # exit 1 on a significant regression
    sepa-eval review list        # candidates awaiting review; `review approve|reject ID`
    sepa-eval promote --dry-run  # what the promotion gate would decide now
    sepa-eval down

Global options come before the command: `sepa-eval --memory-dir /tmp/m status`.

The commands live by area: stack.py (up, down, status, topics), events.py (synth, sink, replay,
sync-models, rollout, rollout-worker), loop.py (run, critics), read.py (report, diff, exports, prune),
verbs.py (review, promote, eval). Each command builds what
it needs from the settings (infra/cli/base.py), at the edge: the settings, one codec per process (``codec_of``),
the clients and the store. Command functions do not call each other; what several commands do
lives in infra/orchestrator.py, infra/waits.py, infra/reviews.py, infra/processes.py and
infra/supervisor.py.

Errors go to ``err``: one line per error where the error is one line, never wrapped at the
terminal's width, never styled when stderr is not a terminal, and never read as rich markup.
"""

from __future__ import annotations

from infra.cli import events, lerobot, libero, loop, read, stack, verbs  # noqa: E402,F401  (registers the commands)
from infra.cli.base import app, fail  # noqa: F401  (the entry point, `sepa-eval = "infra.cli:app"`)
