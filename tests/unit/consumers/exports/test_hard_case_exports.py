"""Hard-case exports on a real chDB store: which episodes, the JSONL lines, and the LeRobot v3.0
dataset read back with pyarrow and checked against LeRobot's format rules (the rules are written
out here from huggingface/lerobot's src/lerobot/datasets/{utils,dataset_metadata,dataset_writer,
compute_stats}.py, independently of the exporter's own constants)."""

from __future__ import annotations

import hashlib
import io
import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hard_case_world import KEYFRAME_EVERY, STEPS, build_world, with_kind
from PIL import Image

from consumers.exports.exceptions import NothingToExport, OutputExists
from consumers.exports.jsonl import export_jsonl
from consumers.exports.lerobot import export_lerobot
from consumers.exports.output import ExportFilters
from consumers.exports.queries import hard_cases
from tests.store_events import store_events

LEROBOT_STATS = {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
LEROBOT_DEFAULT_FEATURES = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64",
                            "index": "int64", "task_index": "int64"}
ARROW_DTYPES = {"float32": pa.float32(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}


@pytest.fixture
def world(store, tmp_path):
    return build_world(store, tmp_path / "keyframes")


# --- which episodes --------------------------------------------------------------------------------

def test_failed_episodes_are_selected_and_harness_failures_and_clean_successes_are_not(store, world):
    selected = {c.episode_id: c for c in hard_cases(store)}
    assert set(selected) == set(with_kind(world, "failed", "unanalysed_failed"))
    assert {c.kind for c in selected.values()} == {"failed"}
    unanalysed = [selected[e] for e in with_kind(world, "unanalysed_failed")]
    assert all(c.analysed is None and c.moments == () for c in unanalysed)
    analysed = [selected[e] for e in with_kind(world, "failed")]
    assert all(c.analysed and c.failure_types == ["grasp_miss", "timeout"] for c in analysed)
    ended = [c.ended_at for c in hard_cases(store)]
    assert ended == sorted(ended)


def test_recovered_successes_only_with_the_flag(store, world):
    with_recovered = {c.episode_id: c for c in hard_cases(store, include_recovered=True)}
    assert set(with_recovered) == set(with_kind(world, "failed", "unanalysed_failed", "recovered"))
    recovered = [with_recovered[e] for e in with_kind(world, "recovered")]
    assert all(c.kind == "recovered" and c.success and c.moments[0].recovered for c in recovered)
    assert recovered[0].moments[0].recovery == "regrasped" and recovered[0].moments[0].recovered_step == 8


def test_failure_type_and_since_filters(store, world):
    assert {c.episode_id for c in hard_cases(store, failure_type="grasp_miss")} == set(with_kind(world, "failed"))
    assert {c.episode_id for c in hard_cases(store, failure_type="slip", include_recovered=True)} \
        == set(with_kind(world, "recovered"))
    assert hard_cases(store, failure_type="drop") == []
    newest = max(world.ended[e]["envelope"]["event_time"] for e in with_kind(world, "failed"))
    assert [c.episode_id for c in hard_cases(store, since=newest - timedelta(seconds=1))] \
        == [e for e in with_kind(world, "failed") if world.ended[e]["envelope"]["event_time"] == newest]


def test_a_redelivered_episode_is_exported_once(store, world, tmp_path):
    episode_id = with_kind(world, "failed")[0]
    store_events(store, [world.started[episode_id], world.ended[episode_id], *world.steps[episode_id]])
    summary = export_jsonl(store, tmp_path / "out", world.keyframes)
    lines = [json.loads(line) for line in (tmp_path / "out" / "hard_cases.jsonl").read_text().splitlines()]
    assert [line["episode_id"] for line in lines].count(episode_id) == 1
    assert len(next(line for line in lines if line["episode_id"] == episode_id)["steps"]) == STEPS
    assert summary.episodes == len(lines)


# --- JSONL ------------------------------------------------------------------------------------------

def test_jsonl_holds_scenario_model_moments_quality_and_steps(store, world, tmp_path):
    out = tmp_path / "jsonl"
    summary = export_jsonl(store, out, world.keyframes, ExportFilters(include_recovered=True))
    lines = [json.loads(line) for line in (out / "hard_cases.jsonl").read_text().splitlines()]
    assert summary.episodes == len(lines) == len(with_kind(world, "failed", "unanalysed_failed", "recovered"))
    assert (summary.failed, summary.recovered) == (4, 2)
    for line in lines:
        started = world.started[line["episode_id"]]
        assert line["scenario"]["scenario_id"] == line["scenario_id"] == started["scenario_id"]
        assert line["model_id"] == started["model_id"] and line["seed"] == started["seed"]
        assert line["instruction"] == started["instruction"]
        assert set(line["quality"]) >= {"smoothness_jerk", "regrasp_count", "peak_contact_force"}
        assert [s["t"] for s in line["steps"]] == list(range(STEPS)) and line["steps_complete"]
        first = world.steps[line["episode_id"]][0]
        assert line["steps"][0]["action"] == pytest.approx(first["action"], abs=1e-6)
        for moment in line["moments"]:
            assert moment["recovered"] == (moment["recovered_step"] >= 0)
        for step in line["steps"]:
            if step["t"] % KEYFRAME_EVERY == 0:
                data = (out / step["keyframe"]).read_bytes()
                assert hashlib.sha256(data).hexdigest() == step["keyframe_sha256"]
            else:
                assert step["keyframe"] is None and step["keyframe_sha256"] is None
    assert summary.keyframes == len(list((out / "keyframes").iterdir())) == len(lines) * STEPS // KEYFRAME_EVERY


def test_nothing_to_export_and_no_overwrite(store, tmp_path):
    with pytest.raises(NothingToExport, match="no episode"):
        export_jsonl(store, tmp_path / "empty", None)
    assert not (tmp_path / "empty").exists()
    build_world(store, tmp_path / "keyframes")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(OutputExists):
        export_lerobot(store, tmp_path / "busy", tmp_path / "keyframes")
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"


# --- LeRobot v3.0 -----------------------------------------------------------------------------------

def check_lerobot_v3(root: Path) -> dict:
    """Everything a LeRobot 0.6 loader relies on, read back with pyarrow; returns info.json."""
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    for legacy in ("meta/episodes.jsonl", "meta/tasks.jsonl", "meta/episodes_stats.jsonl"):
        assert not (root / legacy).exists(), f"{legacy} is the v2.1 layout"
    assert info["fps"] > 0 and info["chunks_size"] > 0
    features = info["features"]
    for name, dtype in LEROBOT_DEFAULT_FEATURES.items():
        assert features[name]["dtype"] == dtype and features[name]["shape"] == [1], name

    # data: one file per (chunk, file) named by the data_path template, columns = features.
    data_files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    assert data_files and info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    data = pa.concat_tables([pq.read_table(p) for p in data_files])
    assert set(data.column_names) == {k for k, ft in features.items() if ft["dtype"] != "video"}
    for key, ft in features.items():
        if ft["dtype"] == "video":  # its frames are in videos/, not in the data files
            continue
        column_type = data.schema.field(key).type
        if ft["dtype"] == "image":
            assert pa.types.is_struct(column_type) and {f.name for f in column_type} == {"bytes", "path"}
            first = data.column(key)[0].as_py()
            image = np.asarray(Image.open(io.BytesIO(first["bytes"])))
            assert list(image.shape) == ft["shape"] and ft["names"] == ["height", "width", "channels"]
        elif ft["shape"] == [1]:
            assert column_type == ARROW_DTYPES[ft["dtype"]], key
        else:
            assert pa.types.is_list(column_type) or pa.types.is_fixed_size_list(column_type), key
            assert column_type.value_type == ARROW_DTYPES[ft["dtype"]], key
            lengths = {len(v) for v in data.column(key).to_pylist()}
            assert lengths == {ft["shape"][0]}, key
            assert ft["names"] is None or len(ft["names"]) == ft["shape"][0], key

    # bookkeeping: global index, per-episode frame index and timestamps.
    index = data.column("index").to_numpy()
    episode_index = data.column("episode_index").to_numpy()
    frame_index = data.column("frame_index").to_numpy()
    assert (index == np.arange(len(index))).all()
    assert info["total_frames"] == len(index)
    assert (np.diff(episode_index) >= 0).all()

    episodes = pa.concat_tables([pq.read_table(p) for p in sorted((root / "meta" / "episodes").glob(
        "chunk-*/file-*.parquet"))]).to_pylist()
    assert [e["episode_index"] for e in episodes] == list(range(info["total_episodes"]))
    assert info["splits"] == {"train": f"0:{info['total_episodes']}"}
    position = 0
    for episode in episodes:
        assert episode["dataset_from_index"] == position
        assert episode["dataset_to_index"] - episode["dataset_from_index"] == episode["length"]
        rows = slice(episode["dataset_from_index"], episode["dataset_to_index"])
        assert (episode_index[rows] == episode["episode_index"]).all()
        assert (frame_index[rows] == np.arange(episode["length"])).all()
        timestamps = data.column("timestamp").to_numpy()[rows]
        assert np.allclose(timestamps, frame_index[rows] / info["fps"], atol=1e-4)
        path = root / info["data_path"].format(chunk_index=episode["data/chunk_index"],
                                              file_index=episode["data/file_index"])
        assert path.exists()
        for key in features:
            assert LEROBOT_STATS <= {c.split("/")[2] for c in episode if c.startswith(f"stats/{key}/")}, key
        position = episode["dataset_to_index"]
    assert position == info["total_frames"]

    # tasks: a frame indexed by task with task_index, covering every frame's task_index.
    tasks = pd.read_parquet(root / "meta" / "tasks.parquet")
    assert tasks.index.name == "task" and list(tasks.columns) == ["task_index"]
    assert sorted(tasks["task_index"]) == list(range(info["total_tasks"])) == list(range(len(tasks)))
    by_index = dict(zip(tasks["task_index"], tasks.index, strict=True))
    task_index = data.column("task_index").to_numpy()
    for episode in episodes:
        frames = task_index[episode["dataset_from_index"]:episode["dataset_to_index"]]
        assert {by_index[i] for i in frames} == set(episode["tasks"])

    # stats: every feature, LeRobot's stat names, shapes of the feature (images per channel).
    stats = json.loads((root / "meta" / "stats.json").read_text())
    assert set(stats) == set(features)
    for key, ft in features.items():
        assert set(stats[key]) == LEROBOT_STATS, key
        # Images and videos count the frames LeRobot samples (all of them up to 100 per episode).
        assert stats[key]["count"] == [info["total_frames"]] or ft["dtype"] in ("image", "video"), key
        expected = (3, 1, 1) if ft["dtype"] in ("image", "video") else tuple(ft["shape"])
        for name, value in stats[key].items():
            if name != "count":
                assert np.asarray(value).shape == expected, (key, name)
        if ft["dtype"] not in ("image", "video"):
            column = data.column(key).to_pylist()
            values = np.asarray(column, dtype=np.float64).reshape(len(column), -1)
            assert np.allclose(stats[key]["min"], values.min(axis=0), atol=1e-6)
            assert np.allclose(stats[key]["max"], values.max(axis=0), atol=1e-6)
            assert np.allclose(stats[key]["mean"], values.mean(axis=0), atol=1e-5)
            # LeRobot's std is sqrt(E[x^2] - E[x]^2) in float32 for float32 features: its error is
            # relative to E[x^2], not to the std (a constant feature's std comes out near 1e-5, not 0).
            second_moment = (values**2).mean(axis=0)
            assert (np.abs(np.square(stats[key]["std"]) - values.var(axis=0))
                    <= 1e-5 * second_moment + 1e-12).all(), key
    return info


def test_lerobot_export_reads_back_as_a_v3_dataset(store, world, tmp_path):
    out = tmp_path / "lerobot"
    summary = export_lerobot(store, out, world.keyframes, ExportFilters(include_recovered=True))
    info = check_lerobot_v3(out)
    expected = with_kind(world, "failed", "unanalysed_failed", "recovered")
    assert info["total_episodes"] == summary.episodes == len(expected)
    assert info["total_frames"] == summary.frames == len(expected) * STEPS
    assert info["features"]["action"]["shape"] == [7]
    assert info["features"]["observation.state"]["shape"] == [7 + 3 + 4 + 1]
    assert info["features"]["observation.images.keyframe"]["shape"] == [16, 16, 3]
    instructions = {world.started[e]["instruction"] for e in expected}
    assert set(pd.read_parquet(out / "meta" / "tasks.parquet").index) == instructions

    episodes = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert {e["episode_id"] for e in episodes} == set(expected)
    data = pq.read_table(out / "data" / "chunk-000" / "file-000.parquet")
    assert pq.ParquetFile(out / "data" / "chunk-000" / "file-000.parquet").metadata.num_row_groups == len(episodes)
    # Frame t holds the latest keyframe at or before t: frames 0-3 the step-0 frame, 4-7 the step-4 one.
    first = episodes[0]
    images = data.column("observation.images.keyframe").to_pylist()[first["dataset_from_index"]:
                                                                    first["dataset_to_index"]]
    steps = world.steps[first["episode_id"]]
    for t, image in enumerate(images):
        held = steps[t - t % KEYFRAME_EVERY]["keyframe_sha256"]
        assert hashlib.sha256(image["bytes"]).hexdigest() == held
    actions = data.column("action").to_pylist()[first["dataset_from_index"]:first["dataset_to_index"]]
    assert np.allclose(actions, [s["action"] for s in steps], atol=1e-6)


def test_lerobot_leaves_out_episodes_with_missing_steps_and_says_why(store, world, tmp_path):
    pruned = with_kind(world, "failed")[0]
    store.command("ALTER TABLE {database}.rollout_steps DELETE WHERE episode_id = {e:String} AND t = 5",
                  parameters={"e": pruned}, )
    store.command("OPTIMIZE TABLE {database}.rollout_steps FINAL")
    summary = export_lerobot(store, tmp_path / "lerobot", None)
    assert set(summary.skipped) == {pruned} and "11 stored" in summary.skipped[pruned]
    info = check_lerobot_v3(tmp_path / "lerobot")
    assert info["total_episodes"] == len(with_kind(world, "failed", "unanalysed_failed")) - 1
    assert "observation.images.keyframe" not in info["features"]  # no keyframe root given: no images
    jsonl = export_jsonl(store, tmp_path / "jsonl", None)
    line = next(json.loads(x) for x in (tmp_path / "jsonl" / "hard_cases.jsonl").read_text().splitlines()
                if json.loads(x)["episode_id"] == pruned)
    assert not line["steps_complete"] and line["steps_stored"] == STEPS - 1
    assert jsonl.keyframes_missing > 0 and jsonl.keyframes == 0
