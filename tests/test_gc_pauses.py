"""``common/gc_pauses.PauseLog``: a collection at least ``threshold_s`` long is logged with its generation, length and
count; a shorter one is not; installed, it sees a real ``gc.collect()``."""

from __future__ import annotations

import gc
import time

from common.gc_pauses import PauseLog


class _Log:
    def __init__(self):
        self.calls = []

    def warning(self, event, **kw):
        self.calls.append((event, kw))


def test_a_long_collection_is_logged_and_a_short_one_is_not():
    log = _Log()
    pl = PauseLog(log, threshold_s=0.02)
    pl("start", {"generation": 0})
    pl("stop", {"generation": 0, "collected": 3})  # well under 20 ms
    pl("start", {"generation": 2})
    time.sleep(0.03)
    pl("stop", {"generation": 2, "collected": 7})
    assert pl.pauses == 1 and len(log.calls) == 1
    event, kw = log.calls[0]
    assert event == "gc_pause" and kw["generation"] == 2 and kw["collected"] == 7 and kw["ms"] >= 30


def test_installed_it_sees_a_real_collection():
    log = _Log()
    pl = PauseLog(log, threshold_s=0.0).install()
    try:
        gc.collect()
    finally:
        pl.remove()
    assert pl.pauses >= 1 and log.calls[-1][1]["generation"] == 2
    assert pl not in gc.callbacks
