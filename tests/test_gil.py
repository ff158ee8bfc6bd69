"""common/gil.py: the switch interval flag the worker and the scheduler share."""

from __future__ import annotations

import argparse
import sys

import pytest

from common import gil
from scheduler_svc.__main__ import parse_args as scheduler_args
from worker_svc.__main__ import parse_args as worker_args


def test_apply_sets_the_interval_and_refuses_what_is_not_a_time():
    before = sys.getswitchinterval()
    try:
        gil.apply(0.2)
        assert sys.getswitchinterval() == pytest.approx(0.0002)
        for bad in (0, -1, 1001, float("nan")):
            with pytest.raises(ValueError, match="gil-switch-ms"):
                gil.apply(bad)
        assert sys.getswitchinterval() == pytest.approx(0.0002)
    finally:
        sys.setswitchinterval(before)


def test_both_services_take_the_flag_with_the_shared_default_and_range():
    assert worker_args(["--model-path", "x"]).gil_switch_ms == gil.DEFAULT_MS
    assert scheduler_args(["--model-path", "x"]).gil_switch_ms == gil.DEFAULT_MS
    assert worker_args(["--model-path", "x", "--gil-switch-ms", "5"]).gil_switch_ms == 5.0
    for parse in (worker_args, scheduler_args):
        with pytest.raises(SystemExit):
            parse(["--model-path", "x", "--gil-switch-ms", "0"])


def test_add_flag_parses_milliseconds():
    ap = argparse.ArgumentParser()
    gil.add_flag(ap)
    assert ap.parse_args(["--gil-switch-ms", "0.5"]).gil_switch_ms == 0.5
