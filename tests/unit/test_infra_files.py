"""The scale-mode files nothing here can start (no Docker engine): infra/compose/compose.yaml, the
Grafana provisioning and the dashboard. Checked by reading them, and each dashboard query is run
against a chDB store migrated with the project's own migrations.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from consumers.evidence.store import MIGRATIONS_DIR, migrate
from infra.settings import Settings, load_settings
from schemas.catalog import TOPICS

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "infra" / "compose" / "compose.yaml"
GRAFANA_DIR = REPO / "infra" / "grafana"
DATASOURCE_FILE = GRAFANA_DIR / "provisioning" / "datasources" / "clickhouse.yaml"
DASHBOARD_PROVIDER_FILE = GRAFANA_DIR / "provisioning" / "dashboards" / "sepa.yaml"
DASHBOARD_FILE = GRAFANA_DIR / "dashboards" / "sepa-eval.json"
PLUGIN = "grafana-clickhouse-datasource"


# --- helpers ----------------------------------------------------------------------------------

def _evidence_schema() -> dict[str, set[str]]:
    """table -> column names, from the migrations (the source of truth the sink writes to)."""
    tables: dict[str, set[str]] = {}
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        for name, body in re.findall(r"CREATE TABLE IF NOT EXISTS \{database\}\.(\w+) \((.*?)\n\)\s*ENGINE",
                                     path.read_text(), flags=re.S):
            columns = {m.group(1) for m in re.finditer(r"^\s*`?(\w+)`?\s", body, flags=re.M)}
            tables.setdefault(name, set()).update(columns)
    return tables


def _envelope_fields() -> set[str]:
    text = (MIGRATIONS_DIR / "0001_evidence_tables.sql").read_text()
    tuple_body = re.search(r"`envelope` Tuple\((.*?)\),\n", text).group(1)
    return {field.strip().split()[0] for field in tuple_body.split(",")}


EVIDENCE = _evidence_schema()


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _interpolate(value: str) -> str:
    """Compose's own ${VAR:-default} interpolation, with nothing set in the environment."""
    def default(match: re.Match) -> str:
        if match.group(2) is None:
            raise AssertionError(f"{value!r}: ${{{match.group(1)}}} has no default in compose.yaml")
        return match.group(2)
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", default, str(value))


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: _interpolate(value) for key, value in env.items()}


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


def _dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def _queries() -> list[tuple[str, str]]:
    """(panel title, raw SQL) of every query in the dashboard."""
    return [(panel["title"], target["rawSql"]) for panel in _dashboard()["panels"] for target in panel["targets"]]


# The plugin's own macro expansions (grafana/clickhouse-datasource pkg/macros/macros.go), for a
# fixed time range and a 60 s interval.
def expand_macros(sql: str, start: datetime, end: datetime, interval_s: int = 60) -> str:
    s, e = int(start.timestamp()), int(end.timestamp())
    s_ms, e_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    macros = [
        (r"\$__timeFilter_ms\(([^()]+)\)",
         lambda m: f"{m[1]} >= fromUnixTimestamp64Milli({s_ms}) AND {m[1]} <= fromUnixTimestamp64Milli({e_ms})"),
        (r"\$__timeFilter\(([^()]+)\)", lambda m: f"{m[1]} >= toDateTime({s}) AND {m[1]} <= toDateTime({e})"),
        (r"\$__timeInterval_ms\(([^()]+)\)",
         lambda m: f"toStartOfInterval(toDateTime64({m[1]}, 3), INTERVAL {interval_s * 1000} millisecond)"),
        (r"\$__timeInterval\(([^()]+)\)",
         lambda m: f"toStartOfInterval(toDateTime({m[1]}), INTERVAL {interval_s} second)"),
        (r"\$__interval_s\b", lambda m: str(interval_s)),
        (r"\$__fromTime_ms\b", lambda m: f"fromUnixTimestamp64Milli({s_ms})"),
        (r"\$__toTime_ms\b", lambda m: f"fromUnixTimestamp64Milli({e_ms})"),
        (r"\$__fromTime\b", lambda m: f"toDateTime({s})"),
        (r"\$__toTime\b", lambda m: f"toDateTime({e})"),
    ]
    for pattern, replacement in macros:
        sql = re.sub(pattern, replacement, sql)
    return sql


def _with_store_database(sql: str) -> str:
    """The dashboard's ${database} variable -> the store's {database} placeholder."""
    return sql.replace("${database}", "{database}")


# --- compose ----------------------------------------------------------------------------------

def test_compose_has_the_four_services_on_the_pinned_images():
    services = _compose()["services"]
    assert set(services) == {"kafka", "clickhouse", "grafana", "pipeline"}
    assert services["kafka"]["image"] == "apache/kafka:4.1.0"
    assert services["clickhouse"]["image"] == "clickhouse/clickhouse-server:25.8"
    assert re.fullmatch(r"grafana/grafana:12\.\d+\.\d+", services["grafana"]["image"])
    assert services["pipeline"]["image"] == "python:3.11-slim"


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
    assert set(services["pipeline"]["depends_on"]) == {"kafka", "clickhouse"}
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

    # Host clients: the published port is the PLAINTEXT listener, advertised as 127.0.0.1.
    assert advertised["PLAINTEXT"] == "127.0.0.1:9092"
    published = {p.rsplit(":", 1)[1]: p.rsplit(":", 1)[0] for p in kafka["ports"]}
    assert published["9092"] == "127.0.0.1:9092"
    assert listeners["PLAINTEXT"].endswith(":9092")

    # The pipeline's bootstrap is an advertised listener reachable on the compose network.
    pipeline_bootstrap = _environment(_compose()["services"]["pipeline"])["SEPA_BOOTSTRAP_SERVERS"]
    assert pipeline_bootstrap in advertised.values()
    assert pipeline_bootstrap.startswith(f"{kafka['hostname']}:")


def test_pipeline_environment_is_valid_settings_for_the_compose_services():
    services = _compose()["services"]
    env = _environment(services["pipeline"])
    sepa = {key: value for key, value in env.items() if key.startswith("SEPA_")}
    for key in sepa:
        assert key[len("SEPA_"):].lower() in Settings.model_fields, f"{key} is not a setting"
    settings = load_settings(environ=sepa)
    assert not settings.embedded_broker and not settings.embedded_store
    assert settings.clickhouse_database == "sepa"

    clickhouse = _environment(services["clickhouse"])
    assert settings.clickhouse_url == (f"http://{clickhouse['CLICKHOUSE_USER']}:{clickhouse['CLICKHOUSE_PASSWORD']}"
                                       f"@{services['clickhouse']['hostname']}:8123")
    command = " ".join(services["pipeline"]["command"])
    assert "sepa-eval topics" in command and "exec sepa-eval sink" in command
    assert ("../..", "/app") in _bind_mounts(services["pipeline"])


def test_grafana_gets_the_plugin_and_the_provisioning():
    grafana = _compose()["services"]["grafana"]
    env = _environment(grafana)
    plugins = env.get("GF_PLUGINS_PREINSTALL_SYNC", "") + "," + env.get("GF_INSTALL_PLUGINS", "")
    assert PLUGIN in plugins.split(",")
    mounts = dict(_bind_mounts(grafana))
    assert (COMPOSE_FILE.parent / "../grafana/provisioning").resolve() == DATASOURCE_FILE.parents[1]
    assert mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    assert (COMPOSE_FILE.parent / "../grafana/dashboards").resolve() == DASHBOARD_FILE.parent

    provider = yaml.safe_load(DASHBOARD_PROVIDER_FILE.read_text())["providers"][0]
    assert provider["type"] == "file"
    assert mounts["../grafana/dashboards"] == provider["options"]["path"] == "/var/lib/grafana/dashboards"
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{provider['options']['path']}/{DASHBOARD_FILE.name}"


def test_datasource_provisioning_points_at_the_compose_clickhouse():
    text = DATASOURCE_FILE.read_text()
    (source,) = yaml.safe_load(text)["datasources"]
    assert source["type"] == PLUGIN
    json_data = source["jsonData"]
    assert {"host", "port", "protocol", "username", "defaultDatabase"} <= set(json_data)
    assert json_data["protocol"] == "http" and json_data["port"] == 8123
    assert "password" in source["secureJsonData"]

    # Every ${VAR} Grafana expands in this file is set on the grafana service, to the right value.
    services = _compose()["services"]
    env = _environment(services["grafana"])
    for name in re.findall(r"\$\{(\w+)\}", text):
        assert name in env, f"{DATASOURCE_FILE.name} uses ${{{name}}}, not set on the grafana service"
    expanded = yaml.safe_load(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text))["datasources"][0]
    clickhouse = _environment(services["clickhouse"])
    assert expanded["jsonData"]["host"] == services["clickhouse"]["hostname"]
    assert expanded["jsonData"]["username"] == clickhouse["CLICKHOUSE_USER"]
    assert expanded["secureJsonData"]["password"] == clickhouse["CLICKHOUSE_PASSWORD"]
    assert expanded["jsonData"]["defaultDatabase"] == _environment(services["pipeline"])["SEPA_CLICKHOUSE_DATABASE"]

    dashboard_sources = {json.dumps(p["datasource"], sort_keys=True) for p in _dashboard()["panels"]}
    assert dashboard_sources == {json.dumps({"type": PLUGIN, "uid": source["uid"]}, sort_keys=True)}


# --- dashboard --------------------------------------------------------------------------------

def test_dashboard_parses_with_unique_ids_and_one_sql_query_per_panel():
    dashboard = _dashboard()
    ids = [panel["id"] for panel in dashboard["panels"]]
    titles = [panel["title"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and len(titles) == len(set(titles))
    assert dashboard["uid"] and dashboard["title"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["editorType"] == "sql" and target["rawSql"].strip()
            assert target["format"] in (0, 1)  # sqlutil: 0 time series, 1 table
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["database"]["query"] == "sepa"


def test_every_panel_reads_existing_evidence_tables_with_final():
    envelope = _envelope_fields()
    for title, sql in _queries():
        references = re.findall(r"\$\{database\}\.(\w+)(\s+FINAL\b)?", sql)
        assert references, f"{title}: reads no evidence table"
        for table, final in references:
            assert table in EVIDENCE, f"{title}: no table {table} in the migrations"
            assert final, f"{title}: reads {table} without FINAL (duplicates would count twice)"
        for field in re.findall(r"\benvelope\.(\w+)", sql):
            assert field in envelope, f"{title}: envelope has no field {field}"
        assert not re.search(r"\bsepa\.\w+", sql), f"{title}: hard-coded database; use ${{database}}"


def test_events_per_table_panel_covers_every_catalog_table():
    (sql,) = [sql for title, sql in _queries() if title.startswith("Events landed per minute")]
    tables = set(re.findall(r"\$\{database\}\.(\w+)", sql))
    assert tables == {topic.table for topic in TOPICS} == set(EVIDENCE)


@pytest.fixture(scope="module")
def grafana_store(chdb_store):
    store = chdb_store.with_database("sepa_grafana")
    store.command("DROP DATABASE IF EXISTS {database}")
    migrate(store)
    _insert_sample_evidence(store)
    yield store
    store.command("DROP DATABASE IF EXISTS {database}")


def _ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")


def _insert_sample_evidence(store) -> None:
    now = datetime.now(UTC)
    t1, t2 = _ts(now - timedelta(minutes=3)), _ts(now - timedelta(minutes=2))
    landed = _ts(now - timedelta(minutes=1))

    def envelope(event_id: str, event_type: str, at: str) -> str:
        return f"('{event_id}', '{event_type}', '{at}', 'test', 'run-1', 1)"

    episodes = ("INSERT INTO {database}.rollout_episodes "
                "(envelope, episode_id, scenario_id, model_id, success, termination, _ingested_at) VALUES ")
    store.command(episodes + f"({envelope('e0', 'EpisodeStarted', t1)}, 'ep1', 's1', 'm1', false, '', '{landed}'),"
                  f"({envelope('e1', 'EpisodeEnded', t2)}, 'ep1', 's1', 'm1', true, 'success', '{landed}'),"
                  f"({envelope('e2', 'EpisodeEnded', t2)}, 'ep2', 's1', 'm1', false, 'timeout', '{landed}')")
    # The sink re-delivers e1 after a crash: a second part holding the same (key, event_id).
    store.command(episodes + f"({envelope('e1', 'EpisodeEnded', t2)}, 'ep1', 's1', 'm1', true, 'success', "
                  f"'{landed}')")
    store.command("INSERT INTO {database}.rollout_steps (envelope, episode_id, t, _ingested_at) VALUES "
                  f"({envelope('st1', 'Step', t1)}, 'ep1', 0, '{landed}'),"
                  f"({envelope('st2', 'Step', t2)}, 'ep1', 1, '{landed}')")
    store.command("INSERT INTO {database}.failure_moments "
                  "(envelope, episode_id, scenario_id, model_id, failure_type, step, severity) VALUES "
                  f"({envelope('f1', 'FailureMoment', t2)}, 'ep2', 's1', 'm1', 'grasp_slip', 40, 0.7)")
    store.command("INSERT INTO {database}.benchmark_decisions (envelope, scenario_id, reason, approved) VALUES "
                  f"({envelope('d1', 'Promoted', t2)}, 's2', 'passed the gate', true),"
                  f"({envelope('d2', 'ReviewRequested', t2)}, 's3', 'borderline', false)")
    store.command("INSERT INTO {database}.dead_letters (envelope, source_topic, reason, consumer, original) VALUES "
                  f"({envelope('x1', 'DeadLetter', t2)}, 'sepa.rollout.steps', 'bad framing', 'evidence-sink', '')")


def _run_panels(store) -> dict[str, list[tuple]]:
    now = datetime.now(UTC)
    results = {}
    for title, sql in _queries():
        ready = _with_store_database(expand_macros(sql, now - timedelta(hours=1), now + timedelta(minutes=5)))
        assert "$" not in ready, f"{title}: unexpanded macro or variable left in {ready}"
        started = time.monotonic()
        results[title] = store.query(ready)
        assert time.monotonic() - started < 30, f"{title}: slow on a handful of rows"
    return results


def test_every_panel_query_runs_on_the_migrated_store(grafana_store):
    results = _run_panels(grafana_store)
    assert len(results) == len(_queries())


def test_panels_count_a_redelivered_event_once(grafana_store):
    results = _run_panels(grafana_store)
    assert results["Episodes ended"] == [(2,)]
    assert results["Success rate"] == [(0.5,)]
    assert sorted(results["Episodes per termination reason"]) == [("success", 1), ("timeout", 1)]
    landed = {}
    for _minute, table, events in results["Events landed per minute, per table"]:
        landed[table] = landed.get(table, 0) + events
    assert landed == {"rollout_episodes": 3, "rollout_steps": 2, "failure_moments": 1,
                      "benchmark_decisions": 2, "dead_letters": 1}
    ((_, _model, rate),) = results["Success rate per model"]
    assert rate == 0.5
    ((_, p99, p50),) = results["End-to-end lag, rollout_steps"]
    assert 60_000 <= p50 <= p99 <= 120_000  # events 2-3 min old, landed 1 min ago
    assert {row[1] for row in results["Benchmark decisions over time"]} == {"Promoted", "ReviewRequested"}
    assert [row[1:3] for row in results["Dead letters"]] == [("sepa.rollout.steps", 0)]
    assert results["Failure types"][0][:3] == ("grasp_slip", 1, 1)
