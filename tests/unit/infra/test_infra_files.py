"""The scale-mode files nothing here can start (no Docker engine): infra/compose/, the Grafana
provisioning and the dashboards. Checked by reading them: YAML, pinned images (the Kafka and
ClickHouse versions the tests run), environment defaults, every service's command in our CLI, the
read-only Grafana user. And every dashboard panel's SQL, with the plugin's macros expanded as
grafana/clickhouse-datasource does it (pkg/macros/macros.go, v4.20.0), runs read-only against a
chDB store migrated with the project's migrations and holding real events, returning rows of the
expected shape: a renamed column breaks this test.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
import warnings
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import typer.main
import yaml
from store_events import event, store_events

from consumers.evidence.exceptions import StoreQueryError
from consumers.evidence.store import MIGRATIONS_DIR, migrate
from infra.apache_kafka import KAFKA_VERSION
from infra.cli import app
from infra.settings import Settings, load_settings
from producers.seeds import HELD_OUT_FROM
from schemas.catalog import TOPICS

REPO = Path(__file__).resolve().parents[3]
COMPOSE_DIR = REPO / "infra" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
READER_FILE = COMPOSE_DIR / "clickhouse" / "grafana-reader.xml"
GRAFANA_DIR = REPO / "infra" / "grafana"
DATASOURCE_FILE = GRAFANA_DIR / "provisioning" / "datasources" / "clickhouse.yaml"
DASHBOARD_PROVIDER_FILE = GRAFANA_DIR / "provisioning" / "dashboards" / "sepa.yaml"
DASHBOARD_DIR = GRAFANA_DIR / "dashboards"
PLUGIN = "grafana-clickhouse-datasource"
PLUGIN_VERSION = "4.20.0"  # whose pkg/macros/macros.go expand_macros follows
PYTHON_SERVICES = {"pipeline", "streams", "rollout-worker", "critics"}
# Commands a service runs that another engineer's branch adds; checked once they are registered.
ANNOUNCED_COMMANDS = {"critics": "the critics process (issue 10, consumers/critics/)"}
TIME_SERIES, TABLE = 0, 1  # sqlutil format options


# --- helpers ----------------------------------------------------------------------------------

def _evidence_schema() -> dict[str, set[str]]:
    """table -> column names, from the migrations (the source of truth the sink writes to)."""
    tables: dict[str, set[str]] = {}
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        text = path.read_text()
        for name, body in re.findall(r"CREATE TABLE IF NOT EXISTS \{database\}\.(\w+) \((.*?)\n\)\s*ENGINE",
                                     text, flags=re.S):
            columns = {m.group(1) for m in re.finditer(r"^\s*`?(\w+)`?\s", body, flags=re.M)}
            tables.setdefault(name, set()).update(columns)
        for name, column in re.findall(r"ALTER TABLE \{database\}\.(\w+) ADD COLUMN IF NOT EXISTS `(\w+)`", text):
            tables[name].add(column)
    return tables


def _envelope_fields() -> set[str]:
    text = (MIGRATIONS_DIR / "0001_evidence_tables.sql").read_text()
    tuple_body = re.search(r"`envelope` Tuple\((.*?)\),\n", text).group(1)
    return {field.strip().split()[0] for field in tuple_body.split(",")}


EVIDENCE = _evidence_schema()


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _interpolate(value) -> str | None:
    """Compose's own ${VAR:-default} interpolation, with nothing set in the environment; a null
    value is compose's pass-through from the shell (unset here)."""
    if value is None:
        return None

    def default(match: re.Match) -> str:
        if match.group(2) is None:
            raise AssertionError(f"{value!r}: ${{{match.group(1)}}} has no default in compose.yaml")
        return match.group(2)
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", default, str(value))


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: _interpolate(value) for key, value in env.items() if value is not None}


def _bind_mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of the bind mounts (short syntax), named volumes left out."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                mounts.append((volume["source"], volume["target"]))
            continue
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/", "~")):
            mounts.append((source, target))
    return mounts


def _dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}


def _panels() -> list[tuple[str, dict]]:
    return [(name, panel) for name, dashboard in _dashboards().items() for panel in dashboard["panels"]]


def _queries() -> list[tuple[str, dict, str]]:
    """(dashboard file, panel, raw SQL) of every panel query."""
    return [(name, panel, target["rawSql"]) for name, panel in _panels() for target in panel["targets"]]


# The plugin's own macro expansions (grafana/clickhouse-datasource pkg/macros/macros.go), for a
# time range and an interval (the plugin floors both interval macros at 1 s / 1 ms).
def expand_macros(sql: str, start: datetime, end: datetime, interval_s: int = 60) -> str:
    s, e = int(start.timestamp()), int(end.timestamp())
    s_ms, e_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    macros = [
        (r"\$__timeFilter_ms\(([^()]+)\)",
         lambda m: f"{m[1]} >= fromUnixTimestamp64Milli({s_ms}) AND {m[1]} <= fromUnixTimestamp64Milli({e_ms})"),
        (r"\$__timeFilter\(([^()]+)\)", lambda m: f"{m[1]} >= toDateTime({s}) AND {m[1]} <= toDateTime({e})"),
        (r"\$__timeInterval_ms\(([^()]+)\)",
         lambda m: f"toStartOfInterval(toDateTime64({m[1]}, 3), INTERVAL {max(interval_s * 1000, 1)} millisecond)"),
        (r"\$__timeInterval\(([^()]+)\)",
         lambda m: f"toStartOfInterval(toDateTime({m[1]}), INTERVAL {max(interval_s, 1)} second)"),
        (r"\$__interval_s\b", lambda m: str(max(interval_s, 1))),
        (r"\$__fromTime_ms\b", lambda m: f"fromUnixTimestamp64Milli({s_ms})"),
        (r"\$__toTime_ms\b", lambda m: f"fromUnixTimestamp64Milli({e_ms})"),
        (r"\$__fromTime\b", lambda m: f"toDateTime({s})"),
        (r"\$__toTime\b", lambda m: f"toDateTime({e})"),
    ]
    for pattern, replacement in macros:
        sql = re.sub(pattern, replacement, sql)
    return sql


def test_expand_macros_matches_the_plugins_documented_output():
    # docs/sources/query-editor.md of grafana/clickhouse-datasource, "Macros" table.
    start = datetime.fromtimestamp(1415792726.123, UTC)
    end = datetime.fromtimestamp(1447328726.456, UTC)
    assert expand_macros("$__timeFilter(time)", start, end) == \
        "time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)"
    assert expand_macros("$__timeFilter_ms(time)", start, end) == \
        "time >= fromUnixTimestamp64Milli(1415792726123) AND time <= fromUnixTimestamp64Milli(1447328726456)"
    assert expand_macros("$__timeInterval(column)", start, end, 20) == \
        "toStartOfInterval(toDateTime(column), INTERVAL 20 second)"
    assert expand_macros("$__timeInterval_ms(column)", start, end, 0) == \
        "toStartOfInterval(toDateTime64(column, 3), INTERVAL 1 millisecond)"
    assert expand_macros("$__fromTime_ms $__toTime $__interval_s", start, end, 20) == \
        "fromUnixTimestamp64Milli(1415792726123) toDateTime(1447328726) 20"


# --- compose ----------------------------------------------------------------------------------

def test_compose_runs_the_stack_and_the_loop_on_pinned_images(chdb_store):
    services = _compose()["services"]
    assert set(services) == {"kafka", "clickhouse", "grafana"} | PYTHON_SERVICES
    # The Kafka the integration tests start, and the ClickHouse chDB embeds.
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    (engine,), = chdb_store.query("SELECT version()")
    assert services["clickhouse"]["image"] == "clickhouse/clickhouse-server:" + ".".join(engine.split(".")[:2])
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", services["grafana"]["image"])
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: image {image} is not pinned"
    for name in PYTHON_SERVICES:
        build = services[name]["build"]
        assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        assert services[name]["image"] == services["pipeline"]["image"]  # one image, built once


def test_the_image_installs_every_package_of_the_project():
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^FROM (\S+)", text, flags=re.M)
    assert re.fullmatch(r"python:3\.11[.\w-]*", base) and "latest" not in base
    copied = set(re.findall(r"^COPY (\w+) \1$", text, flags=re.M))
    pyproject = (REPO / "pyproject.toml").read_text()
    include = re.search(r"include = \[(.*?)\]", pyproject).group(1)
    packages = {p.strip(' "*') for p in include.split(",")}
    assert packages <= copied, f"the image leaves out {packages - copied}"
    assert re.search(r"^COPY pyproject\.toml README\.md \./$", text, flags=re.M)
    ignore = (COMPOSE_DIR / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git", "eval_memory"} <= set(ignore)


def _commands(service: dict) -> list[list[str]]:
    """The argument lists of the sepa-eval / python -m invocations a service's command runs."""
    command = service["command"]
    script = command[-1] if command[:2] == ["sh", "-ec"] else " ".join(command)
    runs = []
    for part in re.split(r"&&|;|\|", script):
        words = [w for w in part.split() if w not in ("exec",) and not w.startswith((">", "/dev/"))]
        if words and words[0] in ("sepa-eval", "python"):
            runs.append(words)
    return runs


def test_every_service_command_exists():
    cli = typer.main.get_command(app)
    registered = set(cli.commands)
    services = _compose()["services"]
    for name in PYTHON_SERVICES:
        runs = _commands(services[name])
        assert runs, f"{name} runs no sepa-eval or python command"
        for words in runs:
            if words[0] == "python":
                assert words[1] == "-m", words
                # faust replaces its module object on import (its __spec__ is None then)
                assert words[2] in sys.modules or importlib.util.find_spec(words[2]) is not None, \
                    f"{name}: no module {words[2]}"
                if words[2] == "faust":
                    app_module = words[words.index("-A") + 1]
                    assert importlib.util.find_spec(app_module) is not None, f"{name}: no faust app {app_module}"
                continue
            command = words[1]
            if command not in registered and command in ANNOUNCED_COMMANDS:
                warnings.warn(f"{name}: `sepa-eval {command}` is not registered yet ({ANNOUNCED_COMMANDS[command]})",
                              stacklevel=1)
                continue
            assert command in registered, f"{name}: `sepa-eval {command}` is not a command"
            options = {opt for p in cli.commands[command].params for opt in getattr(p, "opts", [])}
            for word in words[2:]:
                if word.startswith("--"):
                    assert word in options, f"{name}: `sepa-eval {command}` has no option {word}"
    assert _commands(services["pipeline"]) == [["sepa-eval", "topics"], ["sepa-eval", "sink"]]


def test_compose_mounts_exist_and_named_volumes_are_declared():
    compose = _compose()
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for source, _target in _bind_mounts(service):
            path = (COMPOSE_FILE.parent / source).resolve()
            if path.is_relative_to(REPO):
                assert path.exists(), f"{name} mounts {source} ({path}), which does not exist"
        for volume in service.get("volumes", []):
            if isinstance(volume, str) and not volume.startswith((".", "/", "~")):
                assert volume.split(":")[0] in declared, f"{name}: volume {volume} is not declared"


def test_compose_services_wait_for_healthy_dependencies():
    services = _compose()["services"]
    for name, service in services.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert condition == {"condition": "service_healthy"}, f"{name} -> {dependency}"
            assert "healthcheck" in services[dependency], f"{name} waits for {dependency}, which has no healthcheck"
    for name in PYTHON_SERVICES:
        assert set(services[name]["depends_on"]) == {"kafka", "clickhouse"}, name
    assert set(services["grafana"]["depends_on"]) == {"clickhouse"}


def test_kafka_is_one_kraft_node_reachable_from_host_and_network():
    kafka = _compose()["services"]["kafka"]
    env = _environment(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])  # base64 of a UUID, as kafka-storage wants
    for key, value in env.items():
        if key.endswith(("_REPLICATION_FACTOR", "_MIN_ISR", "MIN_INSYNC_REPLICAS")):
            assert value == "1", f"{key}={value}: a single broker cannot hold more replicas"

    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols)
    assert set(advertised) == set(listeners) - {env["KAFKA_CONTROLLER_LISTENER_NAMES"]}
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    node_id, controller = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")
    assert node_id == str(env["KAFKA_NODE_ID"])
    assert controller.split(":")[1] == listeners[env["KAFKA_CONTROLLER_LISTENER_NAMES"]].split(":")[1]

    assert advertised["PLAINTEXT"] == "127.0.0.1:9092"
    published = {p.rsplit(":", 1)[1]: p.rsplit(":", 1)[0] for p in kafka["ports"]}
    assert published["9092"] == "127.0.0.1:9092"
    assert listeners["PLAINTEXT"].endswith(":9092")

    for name in PYTHON_SERVICES:
        bootstrap = _environment(_compose()["services"][name])["SEPA_BOOTSTRAP_SERVERS"]
        assert bootstrap in advertised.values() and bootstrap.startswith(f"{kafka['hostname']}:"), name


def test_every_python_service_environment_is_valid_settings():
    services = _compose()["services"]
    clickhouse = _environment(services["clickhouse"])
    for name in PYTHON_SERVICES:
        raw = services[name]["environment"]
        env = _environment(services[name])
        for key in raw:
            if key.startswith("SEPA_"):
                assert key[len("SEPA_"):].lower() in Settings.model_fields, f"{name}: {key} is not a setting"
        settings = load_settings(environ={k: v for k, v in env.items() if k.startswith("SEPA_")})
        assert not settings.embedded_broker and not settings.embedded_store, name
        assert settings.clickhouse_database == "sepa"
        assert settings.clickhouse_url == (f"http://{clickhouse['CLICKHOUSE_USER']}:{clickhouse['CLICKHOUSE_PASSWORD']}"
                                           f"@{services['clickhouse']['hostname']}:8123")
        assert settings.memory_dir == Path("/var/lib/sepa-eval")
        assert any(v.endswith(f":{settings.memory_dir}") for v in services[name]["volumes"]), name


def test_grafana_gets_the_pinned_plugin_and_the_provisioning():
    grafana = _compose()["services"]["grafana"]
    env = _environment(grafana)
    plugins = env.get("GF_PLUGINS_PREINSTALL_SYNC", "").split(",")
    assert f"{PLUGIN}@{PLUGIN_VERSION}" in plugins
    mounts = dict(_bind_mounts(grafana))
    assert (COMPOSE_FILE.parent / "../grafana/provisioning").resolve() == DATASOURCE_FILE.parents[1]
    assert mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    assert (COMPOSE_FILE.parent / "../grafana/dashboards").resolve() == DASHBOARD_DIR

    provider = yaml.safe_load(DASHBOARD_PROVIDER_FILE.read_text())["providers"][0]
    assert provider["type"] == "file"
    assert mounts["../grafana/dashboards"] == provider["options"]["path"] == "/var/lib/grafana/dashboards"
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/")
    assert (DASHBOARD_DIR / Path(home).name).exists()


def test_grafana_reads_through_a_read_only_user():
    text = DATASOURCE_FILE.read_text()
    (source,) = yaml.safe_load(text)["datasources"]
    assert source["type"] == PLUGIN
    json_data = source["jsonData"]
    assert {"host", "port", "protocol", "username", "defaultDatabase"} <= set(json_data)
    assert json_data["protocol"] == "http" and json_data["port"] == 8123

    services = _compose()["services"]
    env = _environment(services["grafana"])
    for name in re.findall(r"\$\{(\w+)\}", text):
        assert name in env, f"{DATASOURCE_FILE.name} uses ${{{name}}}, not set on the grafana service"
    expanded = yaml.safe_load(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text))["datasources"][0]
    assert expanded["jsonData"]["host"] == services["clickhouse"]["hostname"]
    assert expanded["jsonData"]["defaultDatabase"] == _environment(services["pipeline"])["SEPA_CLICKHOUSE_DATABASE"]

    # The user is the users.d one: readonly profile, password from the clickhouse service's env.
    clickhouse = services["clickhouse"]
    assert (f"./{READER_FILE.relative_to(COMPOSE_DIR)}", f"/etc/clickhouse-server/users.d/{READER_FILE.name}") \
        in _bind_mounts(clickhouse)
    root = ET.parse(READER_FILE).getroot()
    (user,) = root.find("users")
    assert user.tag == expanded["jsonData"]["username"]
    assert user.tag != _environment(clickhouse)["CLICKHOUSE_USER"]  # not the writer
    profile = root.find(f"profiles/{user.findtext('profile')}")
    assert profile.findtext("readonly") == "1"
    assert profile.find("constraints/max_execution_time/changeable_in_readonly") is not None
    password_var = user.find("password").get("from_env")
    assert _environment(clickhouse)[password_var] == expanded["secureJsonData"]["password"]
    assert [d.text for d in user.find("allow_databases")] == [expanded["jsonData"]["defaultDatabase"]]


# --- dashboards -------------------------------------------------------------------------------

def test_dashboards_parse_with_unique_ids_and_sql_queries():
    dashboards = _dashboards()
    assert {"sepa-live.json", "sepa-failures.json", "sepa-benchmark.json"} <= set(dashboards)
    uids = [d["uid"] for d in dashboards.values()]
    assert len(uids) == len(set(uids))
    (source,) = yaml.safe_load(DATASOURCE_FILE.read_text())["datasources"]
    for name, dashboard in dashboards.items():
        ids = [panel["id"] for panel in dashboard["panels"]]
        titles = [panel["title"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)) and len(titles) == len(set(titles)), name
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["database"]["query"] == "sepa", name
        for panel in dashboard["panels"]:
            assert panel["datasource"] == {"type": PLUGIN, "uid": source["uid"]}, panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["editorType"] == "sql" and target["rawSql"].strip()
                assert target["format"] in (TIME_SERIES, TABLE)
        used = {v for _, _, sql in _queries() for v in re.findall(r"\$\{(\w+)\}", sql)}
        used |= {v for p in dashboard["panels"] for v in re.findall(r"\$\{(\w+)\}", p["title"])}
        assert {v for v in used if v in variables or v == "database"} <= set(variables) | {"version"}


def test_panels_split_seeds_where_producers_seeds_does():
    bounds = {int(n) for _, _, sql in _queries() for n in re.findall(r"seed >= (\d+)", sql)}
    assert bounds == {HELD_OUT_FROM}, "a dashboard's held-out boundary is not producers/seeds.py's"


def test_panels_use_the_plugins_time_macros():
    for name, panel, sql in _queries():
        target = panel["targets"][0]
        if target["format"] == TIME_SERIES:
            assert re.search(r"\$__timeInterval(_ms)?\(|toStartOfMinute\(", sql), (name, panel["title"])
            assert re.search(r"\$__timeFilter(_ms)?\(", sql), (name, panel["title"])
    with_macros = [p for _, p, sql in _queries() if "$__" in sql]
    assert len(with_macros) >= len(_queries()) - 1  # only "work waiting now" reads the whole log


def test_every_panel_reads_existing_evidence_tables_with_final():
    envelope = _envelope_fields()
    for name, panel, sql in _queries():
        title = f"{name}: {panel['title']}"
        references = re.findall(r"\$\{database\}\.(\w+)(\s+FINAL\b)?", sql)
        assert references, f"{title}: reads no evidence table"
        for table, final in references:
            assert table in EVIDENCE, f"{title}: no table {table} in the migrations"
            assert final, f"{title}: reads {table} without FINAL (duplicates would count twice)"
        for field in re.findall(r"\benvelope\.(\w+)", sql):
            assert field in envelope, f"{title}: envelope has no field {field}"
        assert not re.search(r"\bsepa\.\w+", sql), f"{title}: hard-coded database; use ${{database}}"


def test_events_per_table_panels_cover_every_catalog_table():
    panels = [sql for _, panel, sql in _queries() if panel["title"].startswith("Events landed per minute")]
    assert len(panels) >= 1
    for sql in panels:
        assert set(re.findall(r"\$\{database\}\.(\w+)", sql)) == {t.table for t in TOPICS} == set(EVIDENCE)


# --- every panel against a store with real events ----------------------------------------------

NOW = datetime.now(UTC).replace(microsecond=0)
T0 = NOW - timedelta(minutes=10)


def _at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _sample_events() -> list[dict]:
    """A small run of the whole loop, every kind of event, as the producers shape them."""
    spec = {**event("EpisodeStarted", ("x",), T0)["scenario"], "scenario_id": "s1", "env_name": "Lift",
            "robot": "Panda", "benchmark": "robosuite", "instruction": "lift the cube"}
    quality = event("EpisodeEnded", ("x",), T0)["quality"]
    out = [event("ModelRegistered", ("m1", "1"), _at(0), model_id="m1", version="1", kind="scripted"),
           event("RolloutRequested", ("r1",), _at(0), request_id="r1", scenario_id="s1", scenario=spec,
                 model_id="m1", seeds=[0, 1, 2], purpose="sweep")]
    for i, (episode, success) in enumerate([("ep1", True), ("ep2", False)]):
        out.append(event("EpisodeStarted", (episode,), _at(1 + i), episode_id=episode, request_id="r1",
                         benchmark="robosuite", task="Lift", scenario_id="s1", scenario=spec,
                         instruction="lift the cube", model_id="m1", model_version="1", seed=HELD_OUT_FROM + i))
        out += [event("Step", (episode, t), _at(1 + i + t / 60), episode_id=episode, t=t, action=[0.1] * 7,
                      eef_pos=[0.0, 0.0, 1.0], eef_quat=[0.0, 0.0, 0.0, 1.0], joint_pos=[0.0] * 7)
                for t in range(3)]
        out.append(event("EpisodeEnded", (episode,), _at(2 + i), episode_id=episode, scenario_id="s1", model_id="m1",
                         success=success, termination="success" if success else "timeout", steps=3,
                         quality=quality))
    moment = {"moment_id": "fm1", "failure_type": "grasp_miss", "step": 1, "severity": 0.7, "features": {},
              "recovered_step": -1, "recovery": ""}
    slip = {**moment, "moment_id": "fm2", "failure_type": "slip", "step": 2, "recovered_step": 2,
            "recovery": "regrasped"}
    out += [
        event("FailureMoment", ("ep2", "grasp_miss", 1), _at(3), episode_id="ep2", scenario_id="s1", model_id="m1",
              failure_type="grasp_miss", step=1, severity=0.7),
        event("EpisodeAnalysed", ("ep1",), _at(2), episode_id="ep1", scenario_id="s1", model_id="m1", scenario=spec,
              success=True, termination="success", steps=3, quality=quality, analysed=True),
        event("EpisodeAnalysed", ("ep2",), _at(3), episode_id="ep2", scenario_id="s1", model_id="m1", scenario=spec,
              success=False, termination="timeout", steps=3, quality=quality, analysed=True, moments=[moment, slip]),
        event("ClusterAssigned", ("ep2", 1), _at(4), cluster_id="c1", episode_id="ep2", scenario_id="s1",
              model_id="m1", intake=True, revision=1, position=0),
        event("ClusterUpdated", ("c1", 1), _at(4), cluster_id="c1", size=1, representative_episode_id="ep2",
              representative_scenario_id="s1", dominant_failure_type="grasp_miss", summary="misses the cube",
              summary_source="features", revision=1, position=1),
        event("ClusterUpdated", ("c2", 2), _at(5), cluster_id="c2", size=2, dominant_failure_type="slip",
              revision=2, position=2),
        event("CycleStarted", ("cy1",), _at(5), cycle_id="cy1", cycle=1, benchmark_version=1, models=["m1"]),
        event("CandidateProposed", ("s1",), _at(0), scenario_id="s1", scenario=spec, generator="base", factor="base"),
        event("CandidateProposed", ("s2",), _at(5), scenario_id="s2", parent_scenario_id="s1", operator="friction",
              generator="mutator", factor="friction", cycle_id="cy1", scenario={**spec, "scenario_id": "s2"}),
        event("CandidateProposed", ("s3",), _at(5), scenario_id="s3", parent_scenario_id="s1", operator="mass",
              generator="mutator", factor="mass", cycle_id="cy1", scenario={**spec, "scenario_id": "s3"}),
        event("CriticVerdict", ("s2", "safety"), _at(6), scenario_id="s2", critic="safety", ran=True, score=0.9,
              passed=True),
        event("CriticVerdict", ("s3", "safety"), _at(6), scenario_id="s3", critic="safety", ran=True, score=0.1,
              passed=False),
        event("Promoted", ("s1", 1), _at(0.5), scenario_id="s1", benchmark_version=1, scenario=spec, factor="base"),
        event("Promoted", ("s2", 2), _at(7), scenario_id="s2", benchmark_version=2, parent_scenario_id="s1",
              factor="friction", source_cluster_id="c1", scenario={**spec, "scenario_id": "s2"}),
        event("Rejected", ("s3",), _at(7), scenario_id="s3", reason="not harder"),
        event("Retired", ("s1", 3), _at(8), scenario_id="s1", benchmark_version=3, reason="saturated"),
        event("DeadLetter", ("x",), _at(8), source_topic="sepa.rollout.steps", reason="bad framing",
              consumer="evidence-sink", original=b""),
    ]
    return out


@pytest.fixture(scope="module")
def grafana_store(chdb_store):
    store = chdb_store.with_database("sepa_grafana")
    store.command("DROP DATABASE IF EXISTS {database}")
    migrate(store)
    events = _sample_events()
    store_events(store, events)
    # The sink re-delivers after a crash: the same events again, in a second part.
    store_events(store, [e for e in events if e["envelope"]["event_type"] in ("EpisodeEnded", "Step")])
    yield store
    store.command("DROP DATABASE IF EXISTS {database}")


def _run_panels(store, version: int = 2) -> dict[str, tuple[list[str], list[tuple]]]:
    """title -> (column names, rows) of every panel, read-only as the Grafana user reads."""
    results = {}
    for name, panel, sql in _queries():
        # panels over _ingested_at see the real insert time: the window reaches past it however long
        # the session has run
        ready = expand_macros(sql, NOW - timedelta(hours=1), datetime.now(UTC) + timedelta(minutes=5))
        ready = ready.replace("${database}", store.database).replace("${version}", str(version))
        assert "$" not in ready, f"{name}: {panel['title']}: unexpanded macro or variable left in {ready}"
        started = time.monotonic()
        result = store.client.query(ready, settings={"readonly": 1})
        assert time.monotonic() - started < 30, f"{panel['title']}: slow on a handful of rows"
        results[f"{name}: {panel['title']}"] = (list(result.column_names), [tuple(r) for r in result.result_rows])
    return results


def _variable_queries() -> list[str]:
    return [v["query"]["rawSql"] for d in _dashboards().values() for v in d["templating"]["list"]
            if v["type"] == "query"]


def test_every_panel_returns_rows_of_its_shape_read_only(grafana_store):
    results = _run_panels(grafana_store)
    assert len(results) == len(_queries())
    for name, panel, _sql in _queries():
        columns, rows = results[f"{name}: {panel['title']}"]
        assert rows, f"{name}: {panel['title']} returned no rows from a store that has its events"
        if panel["targets"][0]["format"] == TIME_SERIES:
            assert columns[0] == "time", (panel["title"], columns)
            assert all(isinstance(r[0], datetime) for r in rows), panel["title"]
            assert all(isinstance(v, (int, float)) for r in rows for v in r[-1:]), panel["title"]
        assert all(len(r) == len(columns) for r in rows)
    for sql in _variable_queries():
        versions = grafana_store.client.query(sql.replace("${database}", grafana_store.database),
                                              settings={"readonly": 1}).result_rows
        assert [v for (v,) in versions] == [2, 1]


def test_panels_count_a_redelivered_event_once_and_add_up(grafana_store):
    results = _run_panels(grafana_store)

    def rows(title: str) -> list[tuple]:
        """The panel's rows; a title on several dashboards must answer the same there."""
        found = [result[1] for key, result in results.items() if key.split(": ", 1)[1] == title]
        assert found, f"no panel titled {title!r}"
        assert all(f == found[0] for f in found), f"{title!r} differs between dashboards"
        return found[0]

    assert rows("Episodes ended") == [(2,)]
    assert rows("Success rate") == [(0.5,)]
    assert sum(r[-1] for r in rows("Rollout throughput, steps per second")) * 60 == pytest.approx(6)
    landed: dict[str, int] = {}
    for _minute, table, events in rows("Events landed per minute, per table"):
        landed[table] = landed.get(table, 0) + events
    assert landed["rollout_episodes"] == 4 and landed["rollout_steps"] == 6 and landed["benchmark_decisions"] == 4
    waiting = dict(rows("Work waiting per consumer"))
    assert waiting["rollout workers: seeds requested, episode not ended"] == 1
    assert waiting["failure detector: episodes ended, not analysed"] == 0
    assert waiting["critics: candidates without a verdict"] == 0
    assert waiting["gate: candidates with verdicts, undecided"] == 0
    assert {stage for _, stage, _ in rows("Stage latency, p50 (ms)")} == {"sink", "detector", "clusterer",
                                                                         "rollout queue"}
    recoveries = {r[0]: r[1:3] for r in rows("Moments and recoveries per type")}
    assert recoveries == {"grasp_miss": (1, 0), "slip": (1, 1)}
    assert rows("Cluster growth")[-1][1:] == (2, 3)  # c1 (1 episode) and c2 (2) alive at the end
    funnel = dict(rows("Candidate funnel"))
    assert funnel == {"proposed": 2, "judged by a critic": 2, "passed every critic that ran": 1, "promoted": 1,
                      "rejected": 1}
    (cycle,) = rows("Candidate funnel per cycle")
    assert cycle[:5] == ("cy1", 2, 2, 1, 1)
    # Version 2 holds s1 (base, promoted at v1) and s2; only s1 has episodes: 1 of 2 succeeded.
    (heat,) = rows("Success per model and scenario, benchmark version ${version}")
    assert heat[:5] == ("m1", "s1", 2.0, 1.0, 0.5) and 0 < heat[5] < 0.5 < heat[6] < 1
    by_version = {(v, m): rate for v, m, rate, _ in rows("Success per model across benchmark versions")}
    assert by_version == {("1", "m1"): 0.5, ("2", "m1"): 0.5}  # s1 retired at v3, which promoted nothing
    assert {r[1] for r in rows("Benchmark decisions over time")} == {"Promoted", "Rejected", "Retired"}
    assert [r[1:3] for r in rows("Dead letters")] == [("sepa.rollout.steps", 0)]
    assert rows("Failure types")[0][:3] == ("grasp_miss", 1, 1)


def test_the_read_only_setting_refuses_writes(grafana_store):
    # A query-level SETTINGS clause: chDB is one session for the whole test run, so the setting
    # must not outlive the statement.
    with pytest.raises(StoreQueryError, match="READONLY"):
        grafana_store.command("INSERT INTO {database}.models_registry (model_id) SETTINGS readonly = 1 VALUES ('x')")
    grafana_store.command("INSERT INTO {database}.models_registry (model_id) VALUES ('writable-again')")
    assert grafana_store.query("SELECT count() FROM {database}.models_registry WHERE model_id = 'writable-again'") \
        == [(1,)]
