"""Run in the LIBERO venv by the LIBERO integration tests.

    <libero python> tests/integration/libero_episodes.py record BOOTSTRAP PREFIX REQUEST_JSON
            [--server=M=URI] [--models=PATH] SEED...
        one process records a request's seeds in order, with one env for all of them (as a pool
        process does), through the recorder to a broker; prints the episode summaries as JSON
    <libero python> tests/integration/libero_episodes.py probe SCENARIO_JSON [SCENARIO_JSON ...]
        what each scenario's env looks like after reset(0): the target's start pose and mass, the
        camera and light settings, a keyframe's mean colour, the feasibility verdict on seed 0
    <libero python> tests/integration/libero_episodes.py frames SCENARIO_JSON SCENARIO_JSON
        two envs of one process render in turn: which holds a GL context after each, and whether
        the first env's frames are the same after its context was freed and made again, and the
        same as mujoco.Renderer's
"""

import json
import sys
from pathlib import Path

import numpy as np

from producers.libero.env import LiberoEnv, simulator_versions
from producers.libero.feasibility import check_feasibility
from producers.libero.worker import PRODUCER, episode_identity, load_libero_models
from producers.recorder import record_episode
from schemas.libero_scenario import LiberoScenario


def record(bootstrap: str, prefix: str, request_path: str, *rest: str) -> None:
    from infra.kafka_clients import make_producer
    from producers.publisher import Publisher

    servers = dict(a.split("=", 1)[1].split("=", 1) for a in rest if a.startswith("--server="))
    models_path = next((a.split("=", 1)[1] for a in rest if a.startswith("--models=")), None)
    seeds = [int(a) for a in rest if not a.startswith("--")]
    request = json.loads(Path(request_path).read_text())
    spec = LiberoScenario.from_dict(request["scenario"])
    model = load_libero_models(models_path, policy_servers=servers)[request["model_id"]]
    publisher = Publisher(make_producer(bootstrap), prefix)
    env = LiberoEnv(spec, keyframes=bool(model.cameras[0]))  # a pixel policy's cameras render from it
    out = []
    for seed in seeds:
        identity = episode_identity(request, spec, model, seed, simulator_versions())
        summary = record_episode(model.episode(env, seed), publisher, identity, None)
        out.append({"seed": seed, "episode_id": summary.episode_id, "termination": summary.termination,
                    "steps": summary.steps, "error": summary.error, "producer": PRODUCER})
    publisher.flush()
    env.close()
    print(json.dumps(out))


def probe(*paths: str) -> None:
    out = []
    for path in paths:
        spec = LiberoScenario.from_dict(json.loads(Path(path).read_text()))
        env = LiberoEnv(spec, keyframes=True)
        env.reset(0)
        m, target = env.model, env._by_name[env.target]
        cam = m.cam_pos[[i for i in range(m.ncam) if m.camera(i).name == "agentview"][0]]
        frame = env.render_keyframe(64)
        start = env.signals()["object_poses"][0]
        report = check_feasibility(spec, [0], env=env)  # runs the oracle: read the start state before
        out.append({"scenario_id": spec.scenario_id, "names": list(env.object_names),
                    "target_pos": start["pos"], "target_quat": start["quat"],
                    "target_mass": float(m.body_mass[target.body]),
                    "target_friction": float(m.geom_friction[env._obj_geoms[env.target], 0].min()),  # collision geoms
                    "agentview_pos": cam.tolist(), "light_diffuse": float(m.light_diffuse.sum()),
                    "frame_mean": float(np.asarray(frame, dtype=float).mean()),
                    "feasible": report.feasible, "reasons": list(report.reasons)})
        env.close()
    print(json.dumps(out))


def frames(first_path: str, second_path: str) -> None:
    import mujoco  # here, after producers.libero.env has set MUJOCO_GL

    first, second = (LiberoEnv(LiberoScenario.from_dict(json.loads(Path(p).read_text())), keyframes=True)
                     for p in (first_path, second_path))
    first.reset(0)
    second.reset(0)
    before = [first.render_keyframe(64), *first.camera_images(96)]
    held_after_first = [first._frames is not None, second._frames is not None]
    second.camera_images(96)
    held_after_second = [first._frames is not None, second._frames is not None]
    after = [first.render_keyframe(64), *first.camera_images(96)]
    # mujoco's own Renderer (a context per size) draws the very same pixels as our one context
    with mujoco.Renderer(first.model, 64, 64) as renderer:
        renderer.update_scene(first.data, camera="agentview", scene_option=first._scene_option)
        theirs = renderer.render()
    print(json.dumps({"held_after_first": held_after_first, "held_after_second": held_after_second,
                      "same_frames": all(np.array_equal(a, b) for a, b in zip(before, after, strict=True)),
                      "same_as_mujoco_renderer": bool(np.array_equal(theirs, after[0]))}))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"record": record, "probe": probe, "frames": frames}[command](*args)
