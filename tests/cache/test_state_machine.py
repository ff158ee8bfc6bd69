"""Runs the CacheMachine (tests/cache/machine.py), and proves it can fail by planting a lying eviction receipt."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from cache_svc.pool import Pool
from tests.cache.machine import CacheMachine

SETTINGS = settings(max_examples=200, stateful_step_count=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def test_random_operation_sequences_keep_every_invariant() -> None:
    run_state_machine_as_test(CacheMachine, settings=SETTINGS)


def test_machine_finds_a_receipt_that_counts_what_was_asked_as_freed(monkeypatch) -> None:
    honest = Pool.evict

    def lying_evict(self, num_tokens):
        receipt = honest(self, num_tokens)
        # The production fault (lessons 1): "freed" = what eviction was asked for, not what became allocatable.
        return dataclasses.replace(receipt, freed_tokens=receipt.asked_tokens)

    monkeypatch.setattr(Pool, "evict", lying_evict)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(CacheMachine, settings=settings(SETTINGS, derandomize=True, database=None,
                                                                   phases=[Phase.generate]))
