"""``common/gc_pauses.PauseLog``: a collection at least ``threshold_s`` long is written as one JSON line with its
generation, length and count; a shorter one is not; installed, it sees a real ``gc.collect()``."""

from __future__ import annotations

import gc
import json
import os
import time

from common.gc_pauses import PauseLog


def _lines(r: int) -> list[dict]:
    os.set_blocking(r, False)
    try:
        data = os.read(r, 1 << 16)
    except BlockingIOError:
        return []
    return [json.loads(x) for x in data.decode().splitlines()]


def test_a_long_collection_is_written_and_a_short_one_is_not():
    r, w = os.pipe()
    try:
        pl = PauseLog("worker", fd=w, threshold_s=0.02)
        pl("start", {"generation": 0})
        pl("stop", {"generation": 0, "collected": 3})  # well under 20 ms
        pl("start", {"generation": 2})
        time.sleep(0.03)
        pl("stop", {"generation": 2, "collected": 7})
        (line,) = _lines(r)
    finally:
        os.close(r)
        os.close(w)
    assert pl.pauses == 1
    assert (line["service"], line["event"], line["generation"], line["collected"]) == ("worker", "gc_pause", 2, 7)
    assert line["ms"] >= 30


def test_installed_it_sees_a_real_collection():
    r, w = os.pipe()
    pl = PauseLog("worker", fd=w, threshold_s=0.0).install()
    try:
        gc.collect()
    finally:
        pl.remove()
    try:
        lines = _lines(r)
    finally:
        os.close(r)
        os.close(w)
    assert pl.pauses >= 1 and lines[-1]["generation"] == 2 and pl not in gc.callbacks
