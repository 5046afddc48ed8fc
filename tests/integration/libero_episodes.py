"""Run in the LIBERO venv by tests/integration/test_libero.py: one process records a request's seeds
in order, with one env for all of them (as a pool process does), through the recorder to a broker.

    <libero python> tests/integration/libero_episodes.py BOOTSTRAP PREFIX REQUEST_JSON SEED [SEED ...]
"""

import json
import sys
from pathlib import Path

from infra.kafka_clients import make_producer
from producers.libero.env import LiberoEnv, simulator_versions
from producers.libero.scenario import LiberoScenario
from producers.libero.worker import PRODUCER, episode_identity, load_libero_models, record_episode
from producers.publisher import Publisher


def main() -> None:
    bootstrap, prefix, request_path, *seeds = sys.argv[1:]
    request = json.loads(Path(request_path).read_text())
    spec = LiberoScenario.from_dict(request["scenario"])
    model = load_libero_models()[request["model_id"]]
    publisher = Publisher(make_producer(bootstrap), prefix)
    env = LiberoEnv(spec)
    out = []
    for seed in map(int, seeds):
        identity = episode_identity(request, spec, model, seed, simulator_versions())
        summary = record_episode(env, model.make_policy(), publisher, identity, seed, None, 0)
        out.append({"seed": seed, "episode_id": summary.episode_id, "termination": summary.termination,
                    "producer": PRODUCER})
    publisher.flush()
    env.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
