"""common/switch_interval.py: the services' thread switch interval from CODESERVE_SWITCH_INTERVAL_US."""

from __future__ import annotations

import sys

import pytest

from common import switch_interval


@pytest.fixture(autouse=True)
def restore_interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_unset_keeps_cpythons_interval(monkeypatch) -> None:
    monkeypatch.delenv(switch_interval.ENV, raising=False)
    sys.setswitchinterval(0.005)
    assert switch_interval.configure() == pytest.approx(0.005)


def test_set_in_microseconds(monkeypatch) -> None:
    monkeypatch.setenv(switch_interval.ENV, "250")
    assert switch_interval.configure() == pytest.approx(250e-6)
    assert sys.getswitchinterval() == pytest.approx(250e-6)


@pytest.mark.parametrize("raw", ["fast", "0", "-5", "nan", "inf"])
def test_bad_values_raise_naming_the_variable(monkeypatch, raw) -> None:
    monkeypatch.setenv(switch_interval.ENV, raw)
    before = sys.getswitchinterval()
    with pytest.raises(ValueError, match=switch_interval.ENV):
        switch_interval.configure()
    assert sys.getswitchinterval() == before


def test_a_services_own_value_wins_over_the_variable(monkeypatch) -> None:
    monkeypatch.setenv(switch_interval.ENV, "250")
    assert switch_interval.configure(1000.0) == pytest.approx(1e-3)
    assert sys.getswitchinterval() == pytest.approx(1e-3)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_own_value_raises_and_sets_nothing(bad) -> None:
    before = sys.getswitchinterval()
    with pytest.raises(ValueError, match="microseconds"):
        switch_interval.configure(bad)
    assert sys.getswitchinterval() == before
