"""Fixtures: the default model, an HF greedy oracle with a memo, and ``make_system`` (all four services as real
processes, stopped at module end). Every test that uses a system is followed by ``System.settle``: at idle the
cache's integrity check is empty and available + evictable == capacity (then a flush gives available == capacity).
"""

from __future__ import annotations

import functools

import pytest

from tests.reliability.system import System
from worker_svc.model.default import ensure_default_model


@pytest.fixture(scope="session")
def model_path() -> str:
    return str(ensure_default_model())


@pytest.fixture(scope="session")
def oracle(model_path):
    """``oracle(prompt_ids, n)`` -> HF greedy ids (EOS ignored), memoized."""
    from tests.scheduler import hf

    @functools.lru_cache(maxsize=None)
    def greedy(prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
        return tuple(hf.greedy(model_path, list(prompt), n, eos=None)[0])

    return lambda prompt, n: list(greedy(tuple(prompt), n))


def prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    """``count`` distinct prompts of ``length`` token ids in [5, 1000) (the default model has 1024 ids)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(5, 1000) for _ in range(length)] for _ in range(count)]


@pytest.fixture(scope="module")
def systems(tmp_path_factory):
    """Starts systems on demand (``systems(**kw)``) and stops them at module end (exit codes checked by tests
    that care)."""
    started: list[System] = []

    def make(**kw) -> System:
        s = System.start(tmp_path_factory.mktemp("logs"), **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def settled():
    """Tests register their system here; after the test it must settle (integrity empty, no leaked slot)."""
    registered: list[System] = []
    yield registered.append
    for s in registered:
        s.settle()
