"""Detector benchmark: synthetic rollouts -> broker -> the faust failure-detector agent.

Prints, from one run:
  1. pure costs per step, no broker: Codec.decode, Intake.decode (decode + finite checks),
     EpisodeDetector.on_step, and DetectorStage.process per event (all of the agent's own work),
     with the rate that last one allows on one core;
  2. backlog throughput: N synthetic episodes (Step + EpisodeStarted/Ended) are published first,
     then one faust worker (``streams.app.make_app``, run_clusterer=False, in its own process)
     drains them. Steps/s are counted from the end of the worker's first batch to the end of its
     last, from inside the worker (DetectorStage.process is wrapped, not changed); the share of
     that time spent inside DetectorStage.process is printed, the rest is faust + aiokafka + the
     agent's glue. Repeated ``--repeat`` times, each with a fresh consumer group; medians;
  3. step-to-moment latency at a paced rate (default 5,000 events/s from a separate producer
     process that stamps each event's event_time as it sends it): a FailureMoment carries its
     triggering event's event_time, so latency = the moment's Kafka timestamp (set when the worker
     produced it) minus that event_time; p50/p99/max (also as received by a consumer);
  4. the ratios against issue #4's targets: >= 20,000 steps/s on one worker, p99 < 1 s at 5,000/s.

With ``--workers N`` (scale-out, issue #9 item 11; Apache Kafka unless ``--broker tansu``) it prints
instead, per repeat, the throughput of 1 worker and of N workers in one consumer group draining the
same backlog (the catalog's 4 rollout.steps / rollout.episodes partitions, so 2 workers hold 2
each), side by side with their ratio. The backlog is published, pre-encoded, once every worker
holds its partitions (no rebalance inside the measurement), and steps/s are counted from the end
of publishing to the last batch. Each run also prints the load average and how the machine's cores
were shared (the workers, the broker, everything else) and each worker's partitions and time
waiting for a CPU: the ratio cannot exceed the ratio of cores the workers got. Workers run faust's
own ``worker`` command with ``--without-web`` (several workers on one host would otherwise all bind
port 6066).

Usage:
    python bench/detector.py                         # embedded Tansu broker
    python bench/detector.py --broker kafka          # Apache Kafka from the Maven-assembled jars
    python bench/detector.py --episodes 400 --steps 500 --repeat 3 --rate 5000 --lag-seconds 20
    python bench/detector.py --profile sample        # + where the worker's time goes (sampled stacks)
    python bench/detector.py --profile cprofile      # + cProfile of the worker (slows it down ~2x)
    python bench/detector.py --batch-max 2000 --faust broker_max_poll_records=2000
    python bench/detector.py --skip-lag --repeat 5   # throughput only
    python bench/detector.py --skip-lag --noop-stage # the agent discards batches: faust's own ceiling
    python bench/detector.py --driver aiokafka       # what-if: the stage fed by plain aiokafka batches
    nice -n 10 python bench/detector.py --workers 2  # 1 vs 2 workers in one group (Apache Kafka by default)
    nice -n 10 python bench/detector.py --workers 2 --broker tansu

The machine's cores are shared: compare medians of several repeats, not single runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer  # noqa: E402

from infra.embedded_broker import stop_pid  # noqa: E402
from infra.kafka_clients import ensure_topics, make_producer  # noqa: E402
from infra.local_broker import local_broker  # noqa: E402
from producers.publisher import Publisher  # noqa: E402
from producers.synthetic import episodes, interleaved  # noqa: E402
from schemas.catalog import BY_NAME, topic_for  # noqa: E402
from schemas.codec import Codec  # noqa: E402

TARGET_STEPS_PER_S = 20_000
TARGET_P99_S = 1.0
TARGET_RATE = 5_000
WORKER_START_TIMEOUT_S = 60.0
ASSIGNMENT_REPORT_S = 0.25  # how often a worker writes its partitions into its status file, s
LAG_RUN_ID = "bench-lag"
WARM_RUN_ID = "bench-warm"


# -- traffic ------------------------------------------------------------------------------------

def rollout_events(n_episodes: int, steps: int, seed: int, run_id: str, concurrent: int) -> list[dict]:
    """Synthetic episodes, ``concurrent`` at a time interleaved step by step (as rollout workers
    running side by side publish them), so every partition carries traffic at once."""
    per_episode: list[list[dict]] = []
    for event in episodes(n_episodes, steps, seed, run_id):
        if event["envelope"]["event_type"] == "EpisodeStarted":
            per_episode.append([])
        per_episode[-1].append(event)
    return [e for g in range(0, len(per_episode), concurrent) for e in interleaved(*per_episode[g:g + concurrent])]


def publish_all(bootstrap: str, prefix: str, events: list[dict]) -> float:
    """Publish and wait for the acks; returns events/s."""
    publisher = Publisher(make_producer(bootstrap), prefix)
    start = time.perf_counter()
    for event in events:
        publisher.publish(event)
    publisher.flush()
    return len(events) / (time.perf_counter() - start)


def produce_paced(bootstrap: str, prefix: str, rate: int, seconds: float, steps: int, concurrent: int) -> None:
    """Runs in its own process. Each event's event_time is stamped as it is sent."""
    n = int(rate * seconds)
    events = rollout_events(n // (steps + 2) + 1, steps, 2, LAG_RUN_ID, concurrent)[:n]
    publisher = Publisher(make_producer(bootstrap, **{"linger.ms": 5}), prefix)
    start = time.perf_counter()
    per_slice = max(1, rate // 100)  # 10 ms slices keep the rate even, not bursty
    for i, event in enumerate(events):
        if i % per_slice == 0:
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        event["envelope"]["event_time"] = datetime.now(UTC)
        publisher.publish(event)
        publisher.producer.poll(0)
    publisher.flush()
    elapsed = time.perf_counter() - start
    print(f"paced producer: {n} events in {elapsed:.1f} s = {n / elapsed:,.0f}/s", file=sys.stderr)


# -- pure costs -----------------------------------------------------------------------------------

def _median_us(fn, n: int, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / n * 1e6


def pure_costs(n_episodes: int = 40, steps: int = 500) -> dict[str, float]:
    from streams.deadletter import Intake, RawMessage
    from streams.failures.detector import DetectorConfig, EpisodeDetector
    from streams.failures.router import DetectorStage, RouterConfig

    codec = Codec()
    events = rollout_events(n_episodes, steps, 1, "bench-pure", 8)
    raws = [RawMessage(topic_for(e["envelope"]["event_type"]).full_name("bench."), 0, i,
                       e["episode_id"].encode(), codec.encode(e)) for i, e in enumerate(events)]
    step_raws = [r for r, e in zip(raws, events, strict=True) if e["envelope"]["event_type"] == "Step"]
    decoded = [codec.decode(r.value) for r in step_raws]
    intake = Intake(codec, "bench", "bench-pure")
    n = len(step_raws)

    def detect() -> None:
        detectors: dict[str, EpisodeDetector] = {}
        for step in decoded:
            d = detectors.get(step["episode_id"])
            if d is None:
                d = detectors[step["episode_id"]] = EpisodeDetector(DetectorConfig(), step["episode_id"], "s", "m")
            d.on_step(step)

    def stage() -> None:
        s = DetectorStage(DetectorConfig(), RouterConfig(), "bench.", "bench-pure", codec=codec)
        for i in range(0, len(raws), 1000):
            s.process(raws[i:i + 1000])

    return {
        "decode": _median_us(lambda: [codec.decode(r.value) for r in step_raws], n),
        "intake": _median_us(lambda: [intake.decode(r) for r in step_raws], n),
        "on_step": _median_us(detect, n),
        "stage": _median_us(stage, len(raws)),
    }


# -- the worker (its own process) ---------------------------------------------------------------

def _parse_setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--faust wants NAME=VALUE, got {text!r}")
    for convert in (int, float):
        try:
            return key, convert(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value.lower(), value)


class _StageProbe:
    """Wraps DetectorStage.process on the instance: counts, times, and writes a status file."""

    def __init__(self, stage, status_path: Path, noop: bool = False):
        self.stage = stage
        self.process = (lambda messages: []) if noop else stage.process
        self.status_path = status_path
        self.status = {"pid": os.getpid(), "messages": 0, "batches": 0, "first_batch": 0, "first_end": None,
                       "last_end": None, "in_stage_s": 0.0, "max_batch": 0, "outputs": 0}
        stage.process = self

    def __call__(self, messages):
        messages = list(messages)
        start = time.perf_counter()
        out = self.process(messages)
        elapsed = time.perf_counter() - start
        s = self.status
        s["messages"] += len(messages)
        s["batches"] += 1
        s["outputs"] += len(out)
        s["max_batch"] = max(s["max_batch"], len(messages))
        s["last_end"] = time.time()
        s["sched_last"] = _thread_schedstats()
        s["cpu_last"] = _machine_cpu()
        s["stage_stats"] = dict(self.stage.stats)
        if s["first_end"] is None:
            s["first_end"], s["first_batch"] = s["last_end"], len(messages)
            s["sched_first"], s["cpu_first"] = s["sched_last"], s["cpu_last"]
        else:
            s["in_stage_s"] += elapsed  # the first batch is outside the measured interval
        main_cpu, main_wait = s["sched_last"].get("MainThread", (0, 0))
        s.setdefault("timeline", []).append(  # what --workers measures a window of
            (s["last_end"], s["messages"], *s["cpu_last"], main_cpu, main_wait,
             sum(cpu for cpu, _ in s["sched_last"].values())))
        self.write()
        return out

    def write(self) -> None:
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status))
        os.replace(tmp, self.status_path)


def _machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, every CPU, from /proc/stat."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def _thread_schedstats() -> dict[str, tuple[int, int]]:
    """Per thread of this process: (ns on a CPU, ns runnable but waiting for one), from
    /proc/self/task/*/schedstat. The rest of the wall time the thread was blocked (idle)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            on_cpu, waiting, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[names.get(int(task.name), task.name)] = (int(on_cpu), int(waiting))
    return out


class _Sampler(threading.Thread):
    """Samples every thread's Python stack every ``interval`` s (a poor man's py-spy). A busy
    thread lets the sampler run only when it yields the GIL, so each sample is weighted by the time
    since the previous one; long C calls are attributed where they return. faust runs the aiokafka
    consumer in a thread of its own, so the main thread waiting in select is often waiting for it."""

    def __init__(self, interval: float = 0.001):
        super().__init__(daemon=True, name="bench-sampler")
        self.interval = interval
        self.samples: list[tuple[float, float, str, tuple[str, ...]]] = []  # (wall time, weight s, thread, stack)
        self.stopped = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        last = time.perf_counter()
        while not self.stopped.wait(self.interval):
            frames = sys._current_frames()
            now = time.perf_counter()
            weight, last = now - last, now
            names = {t.ident: t.name for t in threading.enumerate()}
            wall = time.time()
            for ident, frame in frames.items():
                if ident == me:
                    continue
                stack = []
                while frame is not None:
                    stack.append(_where(frame.f_code))
                    frame = frame.f_back
                self.samples.append((wall, weight, names.get(ident, str(ident)), tuple(stack)))

    def dump(self, path: Path, start: float | None, end: float | None) -> None:
        """Own and inclusive time per function and thread within [start, end] (wall clock)."""
        threads: dict[str, dict] = {}
        for when, weight, thread, stack in self.samples:
            if start is None or end is None or not start <= when <= end or not stack:
                continue
            t = threads.setdefault(thread, {"seconds": 0.0, "self": Counter(), "total": Counter()})
            t["seconds"] += weight
            t["self"][stack[0]] += weight
            for where in set(stack):
                t["total"][where] += weight
        path.write_text(json.dumps({name: {"seconds": t["seconds"], "self": t["self"].most_common(),
                                           "total": t["total"].most_common()} for name, t in threads.items()}))


def _where(code) -> str:
    return f"{_short(code.co_filename)}:{code.co_firstlineno}({code.co_name})"


def _short(filename: str) -> str:
    for marker in ("site-packages/", "python3.11/", str(ROOT) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _quiet_monitor(app) -> None:
    """Replace faust's Monitor by one whose per-message hooks do nothing (an experiment: what the
    default Monitor's bookkeeping costs per event)."""
    from faust.sensors import Monitor

    class QuietMonitor(Monitor):
        def on_message_in(self, tp, offset, message) -> None:
            pass

        def on_stream_event_in(self, tp, offset, stream, event):
            return None

        def on_stream_event_out(self, tp, offset, stream, event, state=None) -> None:
            pass

        def on_message_out(self, tp, offset, message) -> None:
            pass

        def track_tp_end_offset(self, tp, offset) -> None:
            pass

    app.monitor = QuietMonitor()


def run_batch_driver(args) -> None:
    """What-if, not the faust agent: the same DetectorStage fed by a plain aiokafka consumer,
    ``getmany`` batches in, outputs through an aiokafka producer flushed before each commit
    (at-least-once). Shows what the stage allows without faust's per-message machinery."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from streams.deadletter import RawMessage
    from streams.failures.detector import DetectorConfig
    from streams.failures.router import DetectorStage, RouterConfig

    bootstrap, prefix, status = args.worker
    stage = DetectorStage(DetectorConfig(), RouterConfig(), prefix, "bench-detector")
    probe = _StageProbe(stage, Path(status), noop=args.noop_stage)
    topics = [BY_NAME[name].full_name(prefix) for name in ("rollout.steps", "rollout.episodes")]
    outputs = {name: BY_NAME[name].full_name(prefix)
               for name in ("failures.moments", "failures.episodes", "deadletter")}

    async def run() -> None:
        consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id=args.app_id,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=6000, heartbeat_interval_ms=1000,
                                    max_partition_fetch_bytes=8 * 1024 * 1024)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await consumer.start()
        await producer.start()
        try:
            while True:
                records = await consumer.getmany(timeout_ms=int(args.batch_within * 1000), max_records=args.batch_max)
                if not records:
                    continue
                batch = [RawMessage(r.topic, r.partition, r.offset, r.key, r.value)
                         for recs in records.values() for r in recs]
                for m in probe(batch):
                    await producer.send(outputs[m.topic], key=m.key, value=m.value)
                await producer.flush()
                await consumer.commit()
        finally:
            await producer.stop()
            await consumer.stop()

    asyncio.run(run())


def run_worker(args) -> None:
    if args.driver == "aiokafka":
        run_batch_driver(args)
        return
    if args.loop == "uvloop":
        import mode.loop

        mode.loop.use("uvloop")  # needs the uvloop package
    from streams.app import StreamsConfig, make_app

    bootstrap, prefix, status = args.worker
    status_path = Path(status)
    config = StreamsConfig(bootstrap_servers=bootstrap, topic_prefix=prefix, app_id=args.app_id,
                           run_id="bench-detector", data_dir=status_path.parent / f"faust-{status_path.stem}",
                           run_clusterer=False, batch_max=args.batch_max, batch_within_s=args.batch_within)
    app = make_app(config)
    for key, value in map(_parse_setting, args.faust):
        setattr(app.conf, key, value)
    if args.quiet_monitor:
        _quiet_monitor(app)
    if args.gc_threshold:
        import gc

        gc.freeze()  # what the app allocated so far is never collected: later collections skip it
        gc.set_threshold(args.gc_threshold, 20, 100)
    probe = _StageProbe(app.failure_detector_stage, status_path, noop=args.noop_stage)
    profile_path = status_path.with_suffix(f".{args.profile}") if args.profile else None
    sampler = profiler = None
    if args.profile == "sample":
        sampler = _Sampler()
        sampler.start()
    elif args.profile == "cprofile":
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    steps_topic = BY_NAME["rollout.steps"].full_name(prefix)

    @app.timer(interval=ASSIGNMENT_REPORT_S, name="bench-assignment")
    async def report_assignment() -> None:  # what --workers waits on before it publishes the backlog
        assignment = sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == steps_topic)
        if (assignment, app.consumer_generation_id) != (probe.status.get("assignment"), probe.status.get("generation")):
            probe.status["assignment"], probe.status["generation"] = assignment, app.consumer_generation_id
            probe.write()

    # faust's own `worker` command, as a deployment runs it; without the web server, so that several
    # workers on one host do not all bind port 6066.
    sys.argv = [sys.argv[0], "--quiet", "--loop", args.loop, "worker", "--without-web", "--loglevel", "warn"]
    try:
        app.main()
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(profile_path))
        if sampler is not None:
            sampler.stopped.set()
            sampler.dump(profile_path, probe.status["first_end"], probe.status["last_end"])


class WorkerProcess:
    def __init__(self, work: Path, bootstrap: str, prefix: str, app_id: str, args, profile: str | None = None,
                 name: str | None = None):
        self.name = name or app_id
        self.status_path = work / f"{self.name}.status.json"
        self.log_path = work / f"{self.name}.log"
        command = [sys.executable, __file__, "--worker", bootstrap, prefix, str(self.status_path),
                   "--app-id", app_id, "--batch-max", str(args.batch_max), "--batch-within", str(args.batch_within)]
        for setting in args.faust:
            command += ["--faust", setting]
        if profile:
            command += ["--profile", profile]
        if args.noop_stage:
            command.append("--noop-stage")
        if args.quiet_monitor:
            command.append("--quiet-monitor")
        if args.gc_threshold:
            command += ["--gc-threshold", str(args.gc_threshold)]
        command += ["--driver", args.driver]
        command += ["--loop", args.loop]
        self.profile_path = self.status_path.with_suffix(f".{profile}") if profile else None
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {"messages": 0}

    def wait_for(self, messages: int, timeout: float, idle_timeout: float = 20.0) -> dict:
        """Until the worker has processed ``messages``; gives up after ``timeout`` or when its count
        has not moved for ``idle_timeout`` once it started."""
        deadline = time.monotonic() + timeout
        last, moved = -1, time.monotonic()
        while time.monotonic() < deadline:
            status = self.status()
            if status["messages"] >= messages:
                return status
            if self.process.poll() is not None:
                raise SystemExit(f"worker exited with {self.process.returncode}; log {self.log_path}")
            if status["messages"] != last:
                last, moved = status["messages"], time.monotonic()
            elif last > 0 and time.monotonic() - moved > idle_timeout:
                break
            time.sleep(0.05)
        raise SystemExit(f"worker processed {self.status()['messages']} of {messages} events; log {self.log_path}")

    def died(self) -> str:
        """What to say when the worker exited: its code and the end of its log (the work dir goes)."""
        lines = self.log_path.read_text(errors="replace").splitlines()[-15:]
        return f"worker {self.name} exited with {self.process.returncode}; its log ends:\n" + "\n".join(lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            stop_pid(self.process.pid, 30.0)


# -- measurements -------------------------------------------------------------------------------

def backlog_run(work: Path, bootstrap: str, prefix: str, expected: int, steps_share: float, run: int, args) -> dict:
    worker = WorkerProcess(work, bootstrap, prefix, f"bench-detector-{run}", args, args.profile)
    try:
        status = worker.wait_for(expected, timeout=WORKER_START_TIMEOUT_S + expected / 500)
    finally:
        worker.stop()
    span = status["last_end"] - status["first_end"]
    counted = status["messages"] - status["first_batch"]
    rate = counted / span if span > 0 else float("nan")
    result = {"events_per_s": rate, "steps_per_s": rate * steps_share, "span_s": span,
              "in_stage": status["in_stage_s"] / span if span > 0 else float("nan"),
              "batches": status["batches"], "mean_batch": status["messages"] / status["batches"],
              "max_batch": status["max_batch"], "outputs": status["outputs"], "stage_stats": status["stage_stats"]}
    threads = {}
    for name, (cpu, wait) in status.get("sched_last", {}).items():
        cpu0, wait0 = status.get("sched_first", {}).get(name, (0, 0))
        if span > 0 and (cpu - cpu0) / 1e9 / span >= 0.01:
            threads[name] = ((cpu - cpu0) / 1e9 / span, (wait - wait0) / 1e9 / span)
    result["threads"] = threads
    main_cpu = threads.get("MainThread", (float("nan"), 0.0))[0] * span
    result["main_cpu_us"] = main_cpu / counted * 1e6 if counted else float("nan")
    if worker.profile_path is not None and worker.profile_path.exists():
        result["profile"] = worker.profile_path
    return result


def encode_backlog(events: list[dict], codec: Codec) -> list[tuple[str, bytes, bytes]]:
    """(catalog topic name, key, Confluent-framed value) per event, encoded once for every scale run."""
    out = []
    for event in events:
        topic = topic_for(event["envelope"]["event_type"])
        out.append((topic.name, topic.message_key(event), codec.encode(event)))
    return out


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc/<pid>/stat (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(exclude: set[int]) -> list[int]:
    """Pids of this process's children but ``exclude``: the broker, in the scale runs."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in exclude:
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _assigned(workers: list[WorkerProcess], partitions: int) -> list[list[int]] | None:
    """Each worker's rollout.steps partitions once every worker holds some of one generation and
    together they hold each partition once; None before that."""
    statuses = [w.status() for w in workers]
    for worker in workers:
        if worker.process.poll() is not None:
            raise SystemExit(worker.died())
    assignments = [status.get("assignment") or [] for status in statuses]
    if len({status.get("generation") for status in statuses}) != 1 or not all(assignments):
        return None
    if sorted(p for a in assignments for p in a) != list(range(partitions)):
        return None
    return assignments


def scale_run(work: Path, bootstrap: str, backlog: list[tuple[str, bytes, bytes]], steps_share: float,
              n_workers: int, run: int, args) -> dict:
    """``n_workers`` faust workers in one consumer group drain ``backlog`` together. The backlog
    (pre-encoded bytes) is published once every worker holds its partitions, so no rebalance falls
    inside the measured interval. Steps/s are counted from the end of publishing (the first batch,
    if later: the publisher does not compete with the workers inside it) to the end of the last
    batch of all the workers; the workers drain the rest of the backlog meanwhile."""
    app_id = f"bench-scale-{run}-{n_workers}w"
    prefix = app_id + "."
    ensure_topics(bootstrap, prefix)
    partitions = BY_NAME["rollout.steps"].partitions
    workers = [WorkerProcess(work, bootstrap, prefix, app_id, args, name=f"{app_id}-{i}") for i in range(n_workers)]
    try:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S * n_workers
        while (assignment := _assigned(workers, partitions)) is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"{n_workers} workers did not share the {partitions} rollout.steps partitions "
                                 f"within {WORKER_START_TIMEOUT_S * n_workers:.0f} s; "
                                 f"logs {[str(w.log_path) for w in workers]}")
            time.sleep(0.1)
        brokers = _children({w.process.pid for w in workers})
        load_before, start = os.getloadavg(), time.time()
        publisher = Publisher(make_producer(bootstrap), prefix)
        for name, key, value in backlog:
            publisher.publish_raw(prefix + name, key, value)
        publisher.flush()
        published, broker_cpu_published = time.time(), sum(map(_process_cpu_s, brokers))
        statuses = wait_all(workers, len(backlog), timeout=WORKER_START_TIMEOUT_S + len(backlog) / 500)
        broker_cores = (sum(map(_process_cpu_s, brokers)) - broker_cpu_published) / (time.time() - published)
        load_after = os.getloadavg()
    finally:
        for worker in workers:
            worker.stop()
    # The window: from the end of publishing (or the first batch, if later) to the last batch, so
    # the publisher does not compete with the workers inside it; each worker's figures are taken
    # from its last batch before the window opened (its first batch, if none).
    opened = max(published, min(s["first_end"] for s in statuses))
    closed = max(s["last_end"] for s in statuses)
    span = closed - opened
    inside = []
    for status in statuses:
        timeline = status["timeline"]
        before = max((e for e in timeline if e[0] <= opened), key=lambda e: e[0], default=timeline[0])
        inside.append((before, timeline[-1]))
    counted = sum(last[1] - before[1] for before, last in inside)
    rate = counted / span if span > 0 else float("nan")
    first_busy, first_total = min((before for before, _ in inside), key=lambda e: e[0])[2:4]
    last_busy, last_total = max((last for _, last in inside), key=lambda e: e[0])[2:4]
    busy = (last_busy - first_busy) / max(1, last_total - first_total)
    per_worker = []
    for worker, (before, last), parts in zip(workers, inside, assignment, strict=True):
        own = last[0] - before[0]
        per_worker.append({"name": worker.name, "partitions": parts, "messages": last[1] - before[1], "span_s": own,
                           "cpu_s": (last[6] - before[6]) / 1e9,
                           "main_on_cpu": (last[4] - before[4]) / 1e9 / own if own > 0 else float("nan"),
                           "main_waiting": (last[5] - before[5]) / 1e9 / own if own > 0 else float("nan")})
    busy_cores = busy * (os.cpu_count() or 1)
    workers_cores = sum(w["cpu_s"] for w in per_worker) / span if span > 0 else float("nan")
    return {"workers": n_workers, "events_per_s": rate, "steps_per_s": rate * steps_share, "span_s": span,
            "published_s": published - start, "counted": counted, "before_window": sum(b[1] for b, _ in inside),
            "busy_cores": busy_cores, "workers_cores": workers_cores,
            "broker_cores": broker_cores, "other_cores": max(0.0, busy_cores - workers_cores - broker_cores),
            "load_before": load_before, "load_after": load_after, "per_worker": per_worker}


def wait_all(workers: list[WorkerProcess], messages: int, timeout: float, idle_timeout: float = 20.0) -> list[dict]:
    """Until the workers together have processed ``messages``; their statuses."""
    deadline = time.monotonic() + timeout
    last, moved = -1, time.monotonic()
    while time.monotonic() < deadline:
        statuses = [w.status() for w in workers]
        done = sum(s["messages"] for s in statuses)
        if done >= messages:
            return statuses
        for worker in workers:
            if worker.process.poll() is not None:
                raise SystemExit(worker.died())
        if done != last:
            last, moved = done, time.monotonic()
        elif last > 0 and time.monotonic() - moved > idle_timeout:
            break
        time.sleep(0.05)
    raise SystemExit(f"the workers processed {last} of {messages} events; logs {[str(w.log_path) for w in workers]}")


def print_scale(runs: list[dict], n_workers: int, args, broker: str, n_events: int) -> None:
    print(f"\nbroker: {broker}   backlog: {args.episodes} episodes x {args.steps} steps ({n_events:,} events, "
          f"{args.concurrent} interleaved), published raw once the workers hold their partitions   "
          f"rollout.steps/episodes partitions: {BY_NAME['rollout.steps'].partitions}   "
          f"batch_max {args.batch_max}, within {args.batch_within} s   cores: {os.cpu_count()}")
    for run in runs:
        print(f"{run['workers']} worker{'s' if run['workers'] > 1 else ' '}:  {run['steps_per_s']:10,.0f} steps/s  "
              f"({run['counted']:,} events in {run['span_s']:.2f} s = {run['events_per_s']:,.0f}/s, after the "
              f"{run['published_s']:.2f} s of publishing in which {run['before_window']:,} were read)\n"
              f"             load average {run['load_before'][0]:.2f} -> {run['load_after'][0]:.2f}; "
              f"cores busy {run['busy_cores']:.2f} of {os.cpu_count()}: workers {run['workers_cores']:.2f}, "
              f"broker {run['broker_cores']:.2f}, everything else {run['other_cores']:.2f}")
        for w in run["per_worker"]:
            print(f"             {w['name']}: rollout.steps {w['partitions']}, {w['messages']:,} events in "
                  f"{w['span_s']:.2f} s = {w['messages'] / w['span_s'] if w['span_s'] > 0 else float('nan'):,.0f}/s; "
                  f"main thread on a CPU {w['main_on_cpu']:.0%}, waiting for one {w['main_waiting']:.0%}")
    one = [r["steps_per_s"] for r in runs if r["workers"] == 1]
    many = [r["steps_per_s"] for r in runs if r["workers"] == n_workers]
    m1, mn = statistics.median(one), statistics.median(many)
    print(f"median:      1 worker {m1:10,.0f} steps/s   {n_workers} workers {mn:10,.0f} steps/s   ratio "
          f"{mn / m1:.2f} (runs: {', '.join(f'{b / a:.2f}' for a, b in zip(one, many, strict=True))})   "
          f"= {mn / TARGET_STEPS_PER_S:.2f} x the {TARGET_STEPS_PER_S:,}/s target")
    c1 = statistics.median(r["workers_cores"] for r in runs if r["workers"] == 1)
    cn = statistics.median(r["workers_cores"] for r in runs if r["workers"] == n_workers)
    print(f"cores the workers got (median): 1 worker {c1:.2f}, {n_workers} workers {cn:.2f} (ratio {cn / c1:.2f}); "
          f"steps/s per core they got: 1 worker {m1 / c1:,.0f}, {n_workers} workers {mn / cn:,.0f}. The ratio of "
          f"throughputs cannot exceed the ratio of cores the workers get: at most {n_workers}, and at most the "
          f"{os.cpu_count()} cores here less what the broker and other processes take")


def scale_main(args) -> int:
    """--workers N: 1 and N workers on the same backlog, alternating which goes first in each repeat."""
    partitions = BY_NAME["rollout.steps"].partitions
    if not 1 < args.workers <= partitions:
        raise SystemExit(f"--workers must be between 2 and the {partitions} rollout.steps partitions, "
                         f"got {args.workers}")
    if args.driver != "faust" or args.profile:
        raise SystemExit("--workers measures faust workers' throughput only: no --driver aiokafka, no --profile")
    events = rollout_events(args.episodes, args.steps, 1, "bench-backlog", args.concurrent)
    backlog = encode_backlog(events, Codec())
    steps_share = args.steps / (args.steps + 2)
    runs = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sepa-bench-detector-")))
        bootstrap = stack.enter_context(local_broker(args.broker, work))
        for r in range(args.repeat):
            for n in ((1, args.workers) if r % 2 == 0 else (args.workers, 1)):
                runs.append(scale_run(work, bootstrap, backlog, steps_share, n, r, args))
                print(f"  run {r}, {n} worker(s): {runs[-1]['steps_per_s']:,.0f} steps/s", file=sys.stderr)
    runs.sort(key=lambda run: run["workers"])  # stable: repeat order within each count
    print_scale(runs, args.workers, args, args.broker, len(backlog))
    return 0


def latency_run(work: Path, bootstrap: str, args) -> dict:
    prefix = "lag."
    ensure_topics(bootstrap, prefix)
    worker = WorkerProcess(work, bootstrap, prefix, "bench-lag", args)
    codec = Codec()
    moments: list[tuple[float, float, float]] = []  # (event_time, kafka timestamp, received)
    timestamp_types: Counter = Counter()
    stop = threading.Event()

    def collect() -> None:
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-lag-reader",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False,
                           "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "fetch.wait.max.ms": 10})
        reader.subscribe([BY_NAME["failures.moments"].full_name(prefix)])
        try:
            while not stop.is_set():
                for msg in reader.consume(500, timeout=0.1):
                    received = time.time()
                    if msg.error():
                        continue
                    event = codec.decode(msg.value())
                    if event["envelope"]["run_id"] != LAG_RUN_ID:
                        continue
                    kind, ts = msg.timestamp()
                    timestamp_types[kind] += 1
                    moments.append((event["envelope"]["event_time"].timestamp(), ts / 1000.0, received))
        finally:
            reader.close()

    reader_thread = threading.Thread(target=collect, name="moment-reader")
    try:
        warm = rollout_events(4, args.steps, 3, WARM_RUN_ID, 4)
        publish_all(bootstrap, prefix, warm)
        worker.wait_for(len(warm), timeout=WORKER_START_TIMEOUT_S)
        reader_thread.start()
        time.sleep(2.0)  # the reader's group join
        paced = int(args.rate * args.lag_seconds)
        producer = subprocess.run([sys.executable, __file__, "--produce-paced", bootstrap, prefix,
                                   "--rate", str(args.rate), "--lag-seconds", str(args.lag_seconds),
                                   "--steps", str(args.steps), "--concurrent", str(args.concurrent)])
        if producer.returncode:
            raise SystemExit("paced producer failed")
        worker.wait_for(len(warm) + paced, timeout=60.0)
        time.sleep(2.0)  # the last moments' way to the reader
    finally:
        stop.set()
        if reader_thread.is_alive():
            reader_thread.join()
        worker.stop()
    if not moments:
        raise SystemExit("no FailureMoment of the paced run arrived")
    produced = sorted(ts - et for et, ts, _ in moments)
    received = sorted(rx - et for et, _, rx in moments)
    return {"moments": len(moments), "timestamp_types": dict(timestamp_types),
            "produced": _quantiles(produced), "received": _quantiles(received)}


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    def q(p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    return q(0.5), q(0.99), values[-1]


def print_profile(path: Path, kind: str, top: int = 30) -> None:
    print(f"\nworker profile ({kind}) {path}:")
    if kind == "cprofile":
        import pstats

        stats = pstats.Stats(str(path))
        by_area: Counter = Counter()
        for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
            by_area[_area(_short(filename))] += tottime
        total = sum(by_area.values())
        print("  own time by area: " + ", ".join(f"{a} {t / total:.0%}" for a, t in by_area.most_common()))
        stats.sort_stats("tottime").print_stats(top)
        return
    for thread, data in json.loads(path.read_text()).items():
        seconds = data["seconds"] or 1.0
        by_area: Counter = Counter()
        for where, weight in data["self"]:
            by_area[_area(where)] += weight
        print(f"  thread {thread}: {data['seconds']:.1f} s sampled between the first and last batch; own time "
              "by area: " + ", ".join(f"{a} {w / seconds:.0%}" for a, w in by_area.most_common()))
        print("  top own time:")
        for where, weight in data["self"][:top]:
            print(f"    {weight / seconds:6.1%}  {where}")
        print("  top inclusive time:")
        for where, weight in data["total"][:top]:
            print(f"    {weight / seconds:6.1%}  {where}")


def _area(where: str) -> str:
    for area in ("schemas/", "streams/", "faust/", "mode/", "aiokafka/", "fastavro/", "asyncio/", "selectors"):
        if where.startswith(area):
            return area.rstrip("/")
    return "other"


# -- main ---------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=["tansu", "kafka"],
                        help="default: tansu; kafka with --workers (Apache Kafka from the Maven-assembled jars)")
    parser.add_argument("--workers", type=int, default=1,
                        help="N > 1: the throughput of 1 and of N workers in one consumer group on the same backlog, "
                             "side by side, and their ratio (no pure costs, no latency run)")
    parser.add_argument("--episodes", type=int, default=200, help="backlog episodes")
    parser.add_argument("--steps", type=int, default=500, help="steps per episode")
    parser.add_argument("--concurrent", type=int, default=16, help="episodes interleaved at a time")
    parser.add_argument("--repeat", type=int, default=3, help="backlog drains (fresh consumer group each)")
    parser.add_argument("--rate", type=int, default=TARGET_RATE, help="paced events/s for the latency run")
    parser.add_argument("--lag-seconds", type=float, default=20.0)
    parser.add_argument("--skip-lag", action="store_true")
    parser.add_argument("--skip-pure", action="store_true")
    parser.add_argument("--batch-max", type=int, default=1000, help="StreamsConfig.batch_max")
    parser.add_argument("--batch-within", type=float, default=0.2, help="StreamsConfig.batch_within_s")
    parser.add_argument("--faust", action="append", default=[], metavar="NAME=VALUE",
                        help="a faust setting for the worker, e.g. broker_max_poll_records=2000")
    parser.add_argument("--noop-stage", action="store_true",
                        help="the agent discards its batches: faust + aiokafka alone (their ceiling)")
    parser.add_argument("--quiet-monitor", action="store_true",
                        help="experiment: a faust Monitor whose per-message hooks do nothing")
    parser.add_argument("--driver", choices=["faust", "aiokafka"], default="faust",
                        help="what-if: 'aiokafka' feeds the same DetectorStage from a plain aiokafka consumer "
                             "(getmany batches, no faust) to show what faust's per-message machinery costs")
    parser.add_argument("--gc-threshold", type=int, default=0,
                        help="experiment: gc.freeze() and this generation-0 threshold in the worker (default 700)")
    parser.add_argument("--loop", choices=["aio", "uvloop"], default="aio",
                        help="the worker's event loop (uvloop needs the uvloop package)")
    parser.add_argument("--profile", choices=["sample", "cprofile"], help="profile the worker's backlog drains")
    parser.add_argument("--worker", nargs=3, metavar=("BOOTSTRAP", "PREFIX", "STATUS"), help=argparse.SUPPRESS)
    parser.add_argument("--app-id", default="bench-detector", help=argparse.SUPPRESS)
    parser.add_argument("--produce-paced", nargs=2, metavar=("BOOTSTRAP", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.broker is None:
        args.broker = "kafka" if args.workers > 1 else "tansu"
    if args.worker:
        run_worker(args)
        return 0
    if args.produce_paced:
        produce_paced(*args.produce_paced, args.rate, args.lag_seconds, args.steps, args.concurrent)
        return 0

    if args.workers > 1:
        return scale_main(args)
    pure = None if args.skip_pure else pure_costs()
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sepa-bench-detector-")))
        bootstrap = stack.enter_context(local_broker(args.broker, work))
        prefix = "bench."
        ensure_topics(bootstrap, prefix)
        backlog = rollout_events(args.episodes, args.steps, 1, "bench-backlog", args.concurrent)
        produced_rate = publish_all(bootstrap, prefix, backlog)
        steps_share = args.steps / (args.steps + 2)
        runs = [backlog_run(work, bootstrap, prefix, len(backlog), steps_share, r, args) for r in range(args.repeat)]
        for run in runs:
            if "profile" in run:
                print_profile(run["profile"], args.profile)
        lag = None if args.skip_lag else latency_run(work, bootstrap, args)

    print(f"\nbroker: {args.broker}   backlog: {args.episodes} episodes x {args.steps} steps "
          f"({len(backlog):,} events, {args.concurrent} interleaved)   batch_max {args.batch_max}, "
          f"within {args.batch_within} s   faust: {' '.join(args.faust) or 'defaults'}   loop: {args.loop}"
          + ("   quiet monitor" if args.quiet_monitor else "")
          + (f"   gc threshold {args.gc_threshold}" if args.gc_threshold else "")
          + ("   DRIVER: plain aiokafka consumer, not the faust agent" if args.driver == "aiokafka" else "")
          + (f"   (profiled: {args.profile})" if args.profile else "")
          + ("   NO-OP STAGE: the agent discards its batches" if args.noop_stage else ""))
    if pure:
        print(f"pure, per step:  decode {pure['decode']:.1f} us   intake (decode + checks) {pure['intake']:.1f} us   "
              f"on_step {pure['on_step']:.1f} us")
        print(f"pure stage:      DetectorStage.process {pure['stage']:.1f} us/event "
              f"= {1e6 / pure['stage']:,.0f} events/s ceiling on one core without faust")
    print(f"published:       {produced_rate:10,.0f} events/s (backlog, acked)")
    for i, run in enumerate(runs):
        print(f"drain {i}:         {run['steps_per_s']:10,.0f} steps/s  ({run['events_per_s']:,.0f} events/s over "
              f"{run['span_s']:.2f} s; {run['in_stage']:.0%} inside DetectorStage.process; {run['batches']} batches, "
              f"mean {run['mean_batch']:.0f}, max {run['max_batch']}; {run['outputs']} outputs)")
        print(f"                 stage: {run['stage_stats']}")
        print("                 worker threads (share of the drain's wall time): " + "; ".join(
            f"{name} on CPU {cpu:.0%}, waiting for a CPU {wait:.0%}" for name, (cpu, wait) in run["threads"].items()))
    median_steps = statistics.median(r["steps_per_s"] for r in runs)
    cpu_us = statistics.median(r["main_cpu_us"] for r in runs)
    median_in_stage = statistics.median(r["in_stage"] for r in runs)
    per_event_us = 1e6 / statistics.median(r["events_per_s"] for r in runs)
    print(f"median:          {median_steps:10,.0f} steps/s   = {median_steps / TARGET_STEPS_PER_S:.2f} x the "
          f"{TARGET_STEPS_PER_S:,}/s target   ({per_event_us:.1f} us/event: {per_event_us * median_in_stage:.1f} "
          f"in the stage, {per_event_us * (1 - median_in_stage):.1f} in faust/aiokafka/agent)")
    print(f"main thread CPU: {cpu_us:10.1f} us/event   = {1e6 / cpu_us:,.0f} events/s if that thread had a core "
          f"to itself ({1e6 / cpu_us / TARGET_STEPS_PER_S:.2f} x the target)")
    if lag:
        p50, p99, worst = lag["produced"]
        r50, r99, rworst = lag["received"]
        print(f"latency at {args.rate:,} events/s for {args.lag_seconds:.0f} s ({lag['moments']} moments, "
              f"timestamps {lag['timestamp_types']}):")
        print(f"  step -> moment produced: p50 {p50:.3f} s   p99 {p99:.3f} s   max {worst:.3f} s   "
              f"p99 = {p99 / TARGET_P99_S:.2f} x the {TARGET_P99_S:.0f} s target")
        print(f"  step -> moment received: p50 {r50:.3f} s   p99 {r99:.3f} s   max {rworst:.3f} s")
        if set(lag["timestamp_types"]) != {TIMESTAMP_CREATE_TIME}:
            print("  (some moment timestamps are not CreateTime: the 'produced' figures are the broker's time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
