"""CPU time of processes, for the benchmarks' host-cost figures (Linux ``/proc``)."""

from __future__ import annotations

import os
import pathlib

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used, all its threads (``/proc/PID/stat`` fields 14 and 15,
    proc(5)). Raises FileNotFoundError when there is no such process."""
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def snapshot(pids: dict[str, int]) -> dict[str, float]:
    """``cpu_seconds`` of each named process."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def per_request_ms(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """CPU milliseconds per request of each process between two snapshots (``requests`` > 0)."""
    return {name: round(1000 * (after[name] - before[name]) / requests, 3) for name in after}
