"""LIBERO behind producers/adapters.py's BenchmarkAdapter protocol (tasks, base scenarios, envs).

    adapter = LiberoAdapter(TaskCatalog(package_dir))
    adapter.tasks()                                     # ["libero_object/pick_up_the_...", ...]
    record = adapter.base_scenario("libero_object/pick_up_the_milk_and_place_it_in_the_basket")
    env = adapter.make_env(record)                      # LiberoEnv (LIBERO venv only)

Not registered in producers.adapters.ADAPTERS: that registry is what the robosuite worker serves,
and LIBERO runs in its own venv and worker (producers/libero/worker.py).
"""

from __future__ import annotations

from typing import Any

from producers.libero.exceptions import LiberoTaskError
from producers.libero.tasks import TaskCatalog
from schemas.libero_scenario import LiberoScenario


class LiberoAdapter:
    name = "libero"

    def __init__(self, catalog: TaskCatalog):
        self.catalog = catalog

    def tasks(self) -> list[str]:
        return [f"{suite}/{task}" for suite, tasks in self.catalog.suites().items() for task in tasks]

    def base_scenario(self, task: str, horizon: int | None = None) -> dict:
        suite, sep, name = task.partition("/")
        if not sep:
            raise LiberoTaskError(f"a LIBERO task is '<suite>/<task name>', got {task!r}")
        return self.catalog.base_scenario(suite, name, horizon).to_dict()

    def make_env(self, scenario: dict, keyframes: bool = False) -> Any:
        from producers.libero.env import LiberoEnv

        return LiberoEnv(LiberoScenario.from_dict(scenario), self.catalog, keyframes=keyframes)
