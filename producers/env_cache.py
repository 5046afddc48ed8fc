"""A rollout process's envs, least recently used dropped: building one takes seconds (robosuite
~3 s, LIBERO 2-5 s), resetting it milliseconds. Keyed by (scenario_id, keyframes): scenario ids
are content hashes, so an env is reused only for the very same scenario. Standard library only:
the LIBERO venv's workers use it too."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class EnvCache:
    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"EnvCache size must be >= 1, got {size!r}")
        self.size = size
        self._envs: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The env under ``key``, built with ``build()`` on first use; the oldest beyond ``size`` closed."""
        env = self._envs.get(key)
        if env is None:
            env = self._envs[key] = build()
            while len(self._envs) > self.size:
                _, old = self._envs.popitem(last=False)
                old.close()
        self._envs.move_to_end(key)
        return env

    def drop(self, key: Hashable) -> None:
        """Closes and forgets the env under ``key`` (one whose simulation raised is not reused)."""
        env = self._envs.pop(key, None)
        if env is not None:
            env.close()

    def keys(self) -> list[Hashable]:
        return list(self._envs)
