import pytest

from producers.env_cache import EnvCache


class Env:
    def __init__(self, name):
        self.name, self.closed = name, False

    def close(self):
        self.closed = True


def test_builds_once_and_closes_the_least_recently_used_beyond_its_size():
    cache, built = EnvCache(2), []

    def build(name):
        built.append(name)
        return Env(name)

    a = cache.get("a", lambda: build("a"))
    b = cache.get("b", lambda: build("b"))
    assert cache.get("a", lambda: build("a")) is a  # reused, and now the most recent
    c = cache.get("c", lambda: build("c"))
    assert built == ["a", "b", "c"] and b.closed and not a.closed and not c.closed
    assert cache.keys() == ["a", "c"]
    cache.drop("a")
    assert a.closed and cache.keys() == ["c"]
    cache.drop("missing")  # nothing to close


def test_a_size_below_one_is_refused():
    with pytest.raises(ValueError, match="size must be >= 1"):
        EnvCache(0)
