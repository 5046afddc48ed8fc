"""A real single-node Apache Kafka broker (KRaft, broker and controller in one JVM) for tests.

The broker is assembled from Maven Central jars (infra/kafka/pom.xml), since Maven Central is the
only place we can download from: no Docker image, no release tarball. Needs ``java`` (17+) and
``mvn`` on PATH.

Command line::

    python -m infra.apache_kafka fetch [--jars-dir DIR]        # download the jars once
    python -m infra.apache_kafka run --work-dir DIR [--jars-dir DIR] [--heap-mb 512]
                                                               # prints the bootstrap, Ctrl-C stops

From Python::

    from infra.apache_kafka import ApacheKafkaBroker

    with ApacheKafkaBroker(tmp_path) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})

The jars are cached in ``~/.cache/sepa-eval/kafka-<version>/`` unless a ``jars_dir`` is given.
``start()`` fetches them itself when they are missing.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Self

from infra.exceptions import KafkaLauncherError

KAFKA_VERSION = "4.4.0"  # must equal kafka.version in infra/kafka/pom.xml

POM = Path(__file__).parent / "kafka" / "pom.xml"
LOG4J_CONFIG = Path(__file__).parent / "kafka" / "log4j2.properties"
READY_LINE = "Kafka Server started"

# Holds the sha256 of the pom the jars came from, so editing the pom invalidates the cache.
_MARKER = ".fetch-complete"
_LOG_TAIL_LINES = 40


def default_jars_dir(cache_root: Path | None = None) -> Path:
    """``<cache_root>/kafka-<KAFKA_VERSION>``; cache_root defaults to ~/.cache/sepa-eval."""
    root = cache_root if cache_root is not None else Path.home() / ".cache" / "sepa-eval"
    return root / f"kafka-{KAFKA_VERSION}"


def fetch_jars(jars_dir: Path | None = None) -> Path:
    """Copy the broker's runtime jars into jars_dir (default: default_jars_dir()) and return it.

    Does nothing when a previous fetch of the same pom completed there.
    """
    jars_dir = Path(jars_dir) if jars_dir is not None else default_jars_dir()
    pom_hash = hashlib.sha256(POM.read_bytes()).hexdigest()
    if _is_complete(jars_dir, pom_hash):
        return jars_dir

    # Copy into a private sibling directory and rename it into place at the end, so an
    # interrupted or concurrent fetch never leaves a half-filled jars_dir (or two versions of a
    # jar on the classpath) behind.
    jars_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = jars_dir.parent / f".{jars_dir.name}.fetch-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    command = [
        "mvn", "-q", "-B", "-f", str(POM),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
    ]
    try:
        _run(command, timeout=900)
        expected_jar = staging / f"kafka_2.13-{KAFKA_VERSION}.jar"
        if not expected_jar.exists():
            raise KafkaLauncherError(
                f"{' '.join(command)} did not produce {expected_jar.name}: KAFKA_VERSION in "
                f"{__file__} and kafka.version in {POM} disagree"
            )
        (staging / _MARKER).write_text(pom_hash + "\n")
        # Another process may have finished the same fetch meanwhile, and may be running a broker
        # from it: keep its copy. Anything else there is a fetch of an older pom or a partial one.
        if not _is_complete(jars_dir, pom_hash):
            shutil.rmtree(jars_dir, ignore_errors=True)
            try:
                staging.rename(jars_dir)
            except OSError:
                if not _is_complete(jars_dir, pom_hash):
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return jars_dir


def _is_complete(jars_dir: Path, pom_hash: str) -> bool:
    marker = jars_dir / _MARKER
    return marker.exists() and marker.read_text().strip() == pom_hash


class ApacheKafkaBroker:
    """One broker+controller JVM listening on 127.0.0.1, with its data and log under work_dir.

    ``start()`` after ``stop()`` or ``kill()`` reuses the same data, ports and cluster id, so a
    crash test can kill the broker, start it again and find its topics and offsets intact at the
    same bootstrap address.
    """

    def __init__(self, work_dir: Path, jars_dir: Path | None = None, heap_mb: int = 512, *,
                 node_id: int = 1, cluster: KafkaCluster | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.jars_dir = jars_dir
        self.heap_mb = heap_mb
        self.log_path = self.work_dir / "broker.log"
        self._process: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None
        self.node_id = node_id
        self.cluster = cluster
        self._port: int | None = cluster.ports[node_id] if cluster else None
        self._controller_port: int | None = cluster.controller_ports[node_id] if cluster else None
        self._cluster_id = cluster.cluster_id if cluster else _new_cluster_id()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def bootstrap_servers(self) -> str:
        if self._port is None:
            raise KafkaLauncherError("the broker has not been started: call start() first")
        return f"127.0.0.1:{self._port}"

    @property
    def pid(self) -> int | None:
        """The java process id of the latest start (None before the first), e.g. to measure it."""
        return self._process.pid if self._process is not None else None

    def start(self, timeout: float = 60) -> str:
        """Start the broker and return its bootstrap address once clients can use it.

        Fetching the jars (first run only) does not count against timeout.
        """
        self.launch(timeout)
        deadline = time.monotonic() + timeout
        try:
            self.wait_until_ready(deadline, timeout)
        except BaseException:
            self.kill()
            raise
        return self.bootstrap_servers

    def launch(self, timeout: float = 60) -> None:
        """Format the data dir on the first start and start the JVM; do not wait for it (a cluster
        member is ready only once a majority of the controller quorum runs)."""
        if self._process is not None and self._process.poll() is None:
            raise KafkaLauncherError(f"the broker is already running (pid {self._process.pid})")
        jars_dir = fetch_jars(self.jars_dir)
        deadline = time.monotonic() + timeout
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self._port is None:
            self._port, self._controller_port = _free_ports(2)
        config = self._write_config()
        classpath = f"{jars_dir}/*"

        if not (self.work_dir / "data" / "meta.properties").exists():
            _run(
                ["java", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-cp", classpath,
                 "kafka.tools.StorageTool", "format", "-t", self._cluster_id, "-c", str(config)],
                timeout=max(deadline - time.monotonic(), 1),
            )

        # Appending keeps the log of a killed run next to the restarted one; we only look for the
        # ready line after this offset.
        self._log_file = self.log_path.open("ab")
        self._log_offset = self._log_file.tell()
        self._process = subprocess.Popen(
            ["java", f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m",
             f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-cp", classpath,
             "kafka.Kafka", str(config)],
            stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            # Own session: Ctrl-C in a terminal reaches only us, and we stop the broker cleanly.
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl, see there
        )

    def wait_until_ready(self, deadline: float, timeout: float) -> None:
        self._wait_until_ready(self._log_offset, deadline, timeout)

    def stop(self, timeout: float = 20) -> None:
        """Shut down cleanly (SIGTERM); SIGKILL if that takes longer than timeout."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._close_log()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no controlled shutdown, no final flush."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._close_log()

    def _write_config(self) -> Path:
        config = self.work_dir / "server.properties"
        port, controller_port = self._port, self._controller_port
        voters = (",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(self.cluster.controller_ports.items()))
                  if self.cluster else f"1@127.0.0.1:{controller_port}")
        replicas = str(len(self.cluster.ports)) if self.cluster else "1"
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            # Static voters: no --standalone at format time, no dynamic quorum to bootstrap.
            "controller.quorum.voters": voters,
            # 127.0.0.1, never localhost: localhost may resolve to ::1 first and the clients
            # would then try an address the broker does not listen on.
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.work_dir / "data"),
            # Internal topics on every broker of the cluster (one alone: one replica); one partition
            # each keeps startup and the first group join / transaction fast.
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": "2" if self.cluster else "1",
            "transaction.state.log.num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": "2" if self.cluster else "1",
            # The default 3 s delay would slow every consumer group's first join in tests.
            "group.initial.rebalance.delay.ms": "0",
            # The default 128 MiB cleaner buffer would take a quarter of the small test heap.
            "log.cleaner.dedupe.buffer.size": str(2 * 1024 * 1024),
            # After kill() the restarted broker cannot register until the controller expires the
            # dead one's session: 9 s by default, which made a restart take ~14 s instead of ~8 s.
            "broker.session.timeout.ms": "3000",
            "broker.heartbeat.interval.ms": "1000",
        }
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return config

    def _wait_until_ready(self, log_offset: int, deadline: float, timeout: float) -> None:
        # The log line says the broker thinks it is up; a metadata call proves that a client can
        # really talk to it on the advertised address.
        while READY_LINE not in self._read_log(log_offset):
            self._fail_if_exited()
            if time.monotonic() > deadline:
                raise KafkaLauncherError(
                    f"no {READY_LINE!r} within {timeout:.0f} s\n{self._log_tail()}"
                )
            time.sleep(0.1)

        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        while True:
            self._fail_if_exited()
            try:
                admin.list_topics(timeout=1)
                return
            except Exception as error:  # KafkaException until the broker answers
                if time.monotonic() > deadline:
                    raise KafkaLauncherError(
                        f"{self.bootstrap_servers} did not answer a metadata request within "
                        f"{timeout:.0f} s: {error}\n{self._log_tail()}"
                    ) from error

    def describe(self) -> str:
        """Whether the JVM still runs, and the tail of its log: what a failing test should show."""
        code = self._process.poll() if self._process is not None else None
        state = "not started" if self._process is None else "running" if code is None else f"exited with code {code}"
        return f"broker pid {self.pid}: {state}\n{self._log_tail()}"

    def _fail_if_exited(self) -> None:
        assert self._process is not None
        code = self._process.poll()
        if code is not None:
            raise KafkaLauncherError(f"the broker exited with code {code}\n{self._log_tail()}")

    def _read_log(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def _log_tail(self) -> str:
        lines = self._read_log(0).splitlines()[-_LOG_TAIL_LINES:]
        return f"--- last {len(lines)} lines of {self.log_path} ---\n" + "\n".join(lines)

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


class KafkaCluster:
    """``size`` brokers+controllers, one JVM each, one KRaft quorum, on 127.0.0.1: replication
    factor ``size`` and min.insync.replicas 2 for every topic created without its own, the way
    Kafka's own system tests bounce brokers (``kill(n)``, ``start(n)`` again on the same data and ports)."""

    def __init__(self, work_dir: Path, size: int = 3, jars_dir: Path | None = None, heap_mb: int = 384) -> None:
        ports = _free_ports(2 * size)
        self.ports = {n: ports[n - 1] for n in range(1, size + 1)}
        self.controller_ports = {n: ports[size + n - 1] for n in range(1, size + 1)}
        self.cluster_id = _new_cluster_id()
        self.brokers = {n: ApacheKafkaBroker(Path(work_dir) / f"node-{n}", jars_dir, heap_mb, node_id=n, cluster=self)
                        for n in self.ports}

    def __enter__(self) -> Self:
        self.start_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for broker in self.brokers.values():
            broker.stop()

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def start_all(self, timeout: float = 120) -> str:
        for broker in self.brokers.values():  # all at once: none is ready before a quorum majority runs
            broker.launch(timeout)
        deadline = time.monotonic() + timeout
        try:
            for broker in self.brokers.values():
                broker.wait_until_ready(deadline, timeout)
        except BaseException:
            for broker in self.brokers.values():
                broker.kill()
            raise
        return self.bootstrap_servers

    def start(self, node_id: int, timeout: float = 90) -> None:
        self.brokers[node_id].start(timeout)

    def kill(self, node_id: int) -> None:
        self.brokers[node_id].kill()

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> node id of its leader (-1 while it has none)."""
        from confluent_kafka.admin import AdminClient

        metadata = AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(topic, timeout=10)
        return {p: m.leader for p, m in metadata.topics[topic].partitions.items()}


def _run(command: list[str], timeout: float) -> None:
    """Run a setup command; on failure raise KafkaLauncherError with the command and output tail."""
    try:
        # Merged output: Maven prints its errors on stdout, not stderr.
        result = subprocess.run(command, check=False, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    except FileNotFoundError as error:
        raise KafkaLauncherError(f"{command[0]} is not installed (needed for: {' '.join(command)})") from error
    except subprocess.TimeoutExpired as error:
        raise KafkaLauncherError(
            f"{' '.join(command)} took longer than {timeout:.0f} s\n{_tail(error.output)}"
        ) from error
    if result.returncode != 0:
        raise KafkaLauncherError(
            f"{' '.join(command)} failed with exit code {result.returncode}\n{_tail(result.stdout)}"
        )


def _tail(output: bytes | None) -> str:
    lines = (output or b"").decode(errors="replace").splitlines()
    return "\n".join(lines[-_LOG_TAIL_LINES:])


def _free_ports(count: int) -> list[int]:
    # Hold all sockets open until every port is chosen, so the kernel cannot hand out one twice.
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _new_cluster_id() -> str:
    # Same format as `kafka-storage random-uuid` (URL-safe base64 of 16 random bytes), without
    # paying a JVM start for it. Kafka avoids ids starting with '-' as they read as CLI options.
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


# A test run that is killed outright skips every teardown; without this its broker would keep half
# a gigabyte and two ports for good. Linux only. The function is looked up here, before any fork,
# so the child between fork and exec only makes the one system call.
# Linux sends the signal when the *thread* that started the broker ends, so start it from a thread
# that lives as long as the broker should (the main thread, in pytest fixtures).
_prctl = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.apache_kafka", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="download the broker jars from Maven Central")
    fetch.add_argument("--jars-dir", type=Path, help=f"default: {default_jars_dir()}")
    run = commands.add_parser("run", help="run a broker until Ctrl-C")
    run.add_argument("--work-dir", type=Path, required=True, help="data, server.properties and broker.log")
    run.add_argument("--jars-dir", type=Path, help=f"default: {default_jars_dir()}")
    run.add_argument("--heap-mb", type=int, default=512)
    args = parser.parse_args(argv)

    try:
        if args.command == "fetch":
            print(fetch_jars(args.jars_dir))
            return 0
        broker = ApacheKafkaBroker(args.work_dir, args.jars_dir, args.heap_mb)
        # SIGTERM (e.g. from a CI script) should stop the broker as cleanly as Ctrl-C does.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            print(broker.start(), flush=True)
            while broker._process is not None and broker._process.poll() is None:
                time.sleep(0.5)
            print(f"the broker exited on its own; see {broker.log_path}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0
        finally:
            broker.stop()
    except KafkaLauncherError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
