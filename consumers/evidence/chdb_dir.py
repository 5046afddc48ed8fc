"""Opening a chDB directory: what a crash on a full disk leaves behind, and the real reason an
open fails.

A disk that fills while the sink works leaves zero-byte table definitions behind
(``metadata/<db>/<table>.sql``, written by ClickHouse when it creates a table): chDB then refuses
the whole directory with "Cannot parse definition from metadata file", reported to the caller as
BAD_ARGUMENTS, which read like another process holding the directory. Seen: seven empty
definitions of the sink's staging tables, which are Memory tables (they hold nothing across a
restart, and the sink re-creates them); every evidence table and its data were intact. So before
an open, empty definitions in the staging database are removed; an empty definition of any other
table is named, never removed (its data is there, and only a person can say which schema it had).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

STAGING_SUFFIX = "_sink_staging"  # the staging tables' database: <evidence database>_sink_staging


def clear_empty_staging_definitions(path: Path) -> list[Path]:
    """Removes the zero-byte staging-table definitions under ``path``; returns them."""
    removed = []
    for sql in sorted(path.glob(f"metadata/*{STAGING_SUFFIX}/*.sql")):
        if sql.stat().st_size == 0:
            sql.unlink()
            removed.append(sql)
            log.warning("removed %s: an empty definition of a staging table (Memory engine, re-created by the "
                        "sink), left by a crash while the disk was full", sql)
    return removed


def _owned_by_another_process(path: Path) -> bool:
    """Whether another process holds chDB's lock on the directory (its ``status`` file)."""
    status = path / "status"
    if not status.exists():
        return False
    with open(status, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def open_failure(path: Path, exc: Exception) -> str:
    """What to tell a person whose open of the chDB directory ``path`` failed with ``exc``."""
    if _owned_by_another_process(path):
        return ("another process owns this chDB directory: is `sepa-eval up` running? Commands reach the store "
                "through it when it is")
    empty = [p for p in sorted(path.glob("metadata/*/*.sql")) if p.stat().st_size == 0]  # metadata/<db>/<table>.sql
    if empty:
        return (f"{len(empty)} table definition(s) are empty, e.g. {empty[0]} (cut short when the disk filled?); "
                "the tables' data is still under store/: restore the definitions, or move those files away to "
                "drop the tables")
    free = shutil.disk_usage(path).free
    if "NOT_ENOUGH_SPACE" in str(exc) or "No space left" in str(exc) or free < 1024 * 1024:
        return f"out of disk space on {path} ({free} bytes free)"
    return " ".join(str(exc).split())[:500]
