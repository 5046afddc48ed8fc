"""A process that stopped because the disk filled is named as such by `run`'s waits
(infra/waits.py, infra/processes.why_stopped): "the rollout worker has stopped" alone sent
people reading logs for an OSError."""

import pytest

from infra import processes, waits
from infra.exceptions import NotRunning
from infra.settings import load_settings


def test_a_process_stopped_by_a_full_disk_says_so(tmp_path, monkeypatch):
    settings = load_settings(environ={}, memory_dir=tmp_path)
    settings.run_dir.mkdir(parents=True)
    log = processes.ROLLOUT.log(settings)
    log.write_text("x" * 200_000 + "\nOSError: [Errno 28] No space left on device: '/m/keyframes/ab/x.tmp'\n")
    assert processes.why_stopped(processes.ROLLOUT, settings).startswith("out of disk space (")
    log.write_text("Traceback ...\nKeyError: 'x'\n")
    assert processes.why_stopped(processes.ROLLOUT, settings) == ""
    assert processes.why_stopped(processes.PIPELINE, settings) == ""  # no log at all

    log.write_text("DB::Exception: Cannot reserve 1.00 MiB, not enough space. (NOT_ENOUGH_SPACE)\n")

    class Dead(processes.RunState):
        def pid_of(self, child):
            return 4242 if child is processes.ROLLOUT else None

        def alive(self, child):
            return False

    monkeypatch.setattr(processes.RunState, "read", classmethod(lambda cls, s: Dead.__new__(Dead)))
    with pytest.raises(NotRunning, match=r"^the rollout worker \(pid 4242\) has stopped: out of disk space \("):
        waits.still_running(settings)()


def test_a_disk_all_but_full_is_named_when_the_log_could_not_say_so(tmp_path, monkeypatch):
    """A full disk may keep the process from writing its traceback: CI saw "has stopped" alone."""
    settings = load_settings(environ={}, memory_dir=tmp_path)
    settings.run_dir.mkdir(parents=True)
    processes.ROLLOUT.log(settings).write_text("INFO request req-1: 8 episodes\n")  # no last words
    assert processes.why_stopped(processes.ROLLOUT, settings) == ""
    full = processes.shutil.disk_usage(tmp_path)._replace(free=4096)
    monkeypatch.setattr(processes.shutil, "disk_usage", lambda path: full)
    assert processes.why_stopped(processes.ROLLOUT, settings) == f"out of disk space (4096 bytes free under {tmp_path})"


def test_the_waits_stop_on_a_full_disk_while_every_process_runs(tmp_path, monkeypatch):
    """The sink retries a store that cannot write and nobody dies: the waits sat until their timeout."""
    from infra.exceptions import OutOfSpace

    settings = load_settings(environ={}, memory_dir=tmp_path)
    settings.run_dir.mkdir(parents=True)
    waits.still_running(settings)()  # plenty of space, nothing started: nothing to say
    full = processes.shutil.disk_usage(tmp_path)._replace(free=0)
    monkeypatch.setattr(processes.shutil, "disk_usage", lambda path: full)
    with pytest.raises(OutOfSpace, match=r"^out of disk space \(0 bytes free under .*\): the evidence store cannot"):
        waits.still_running(settings)()


def test_a_command_meeting_enospc_anywhere_names_it_as_out_of_disk_space(capsys):
    import errno

    import typer

    from infra.cli import fail

    with pytest.raises(typer.Exit) as exit_info:
        fail(OSError(errno.ENOSPC, "No space left on device", "/m/report.md"))
    assert exit_info.value.exit_code == 1
    line = capsys.readouterr().err.strip()
    assert line == "error: out of disk space writing /m/report.md (No space left on device)"
    with pytest.raises(typer.Exit):
        fail(OSError(errno.EACCES, "Permission denied", "/m/report.md"))
    assert "out of disk space" not in capsys.readouterr().err


def test_a_libero_runs_waits_stop_when_the_libero_worker_has_and_a_robosuite_runs_do_not(tmp_path, monkeypatch):
    """Its pool broke (a process killed for memory) and the worker exited: the LIBERO bench sat to its deadline."""
    settings = load_settings(environ={}, memory_dir=tmp_path)
    settings.run_dir.mkdir(parents=True)
    processes.LIBERO.log(settings).write_text("concurrent.futures.process.BrokenProcessPool: A process in the pool\n")

    class LiberoDead(processes.RunState):
        def pid_of(self, child):
            return 4242 if child is processes.LIBERO else 7

        def alive(self, child):
            return child is not processes.LIBERO

    monkeypatch.setattr(processes.RunState, "read", classmethod(lambda cls, s: LiberoDead.__new__(LiberoDead)))
    waits.still_running(settings)()  # a robosuite run does not rely on it
    waits.still_coming(settings)()
    for check in (waits.still_running(settings, libero=True), waits.still_coming(settings, libero=True)):
        with pytest.raises(NotRunning, match=r"^the LIBERO worker \(pid 4242\) has stopped; see .*libero-worker\.log$"):
            check()
