"""The time between consecutive hops of requests traced with ``CODESERVE_HOP_TRACE=DIR`` (``common/hop_trace.py``).

    python -m bench.hop_report DIR [--json]

Reads every ``DIR/*.tsv`` (request id, hop, monotonic ns), orders each request's hops by time and reports, per
segment ``a -> b`` between consecutive hops, how many requests had it and its p50 and mean in ms, in the order
segments first appear, plus ``total`` (first hop to last) over requests that reached ``--last`` (default
``client_text``, the bench client's first text: ``bench/editor_bench.py --hop-trace``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics


def load(directory: str) -> dict[str, dict[str, int]]:
    """{request id: {hop: ns}} of every file in ``directory`` (the earliest time of a hop marked twice)."""
    hops: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(directory, "*.tsv"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 3:  # a line cut by a killed process
                    continue
                rid, hop, t = parts
                hops[rid][hop] = min(int(t), hops[rid].get(hop, int(t)))
    return hops


def segments(hops: dict[str, dict[str, int]], last: str) -> dict[str, dict]:
    """{segment: {n, p50_ms, mean_ms}} over the requests whose hops include ``last``, cut there."""
    spans: dict[str, list[float]] = {}
    for marks in hops.values():
        if last not in marks:
            continue
        ordered = sorted((t, h) for h, t in marks.items() if t <= marks[last])
        for (t0, a), (t1, b) in zip(ordered, ordered[1:]):
            spans.setdefault(f"{a} -> {b}", []).append((t1 - t0) / 1e6)
        spans.setdefault("total", []).append((ordered[-1][0] - ordered[0][0]) / 1e6)
    return {k: {"n": len(v), "p50_ms": statistics.median(v), "mean_ms": statistics.fmean(v)} for k, v in spans.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--last", default="client_text")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    table = segments(load(a.directory), a.last)
    if a.json:
        print(json.dumps(table, indent=1))
        return
    for name, s in table.items():
        print(f"{name:34s} n={s['n']:5d}  p50 {s['p50_ms']:8.3f} ms  mean {s['mean_ms']:8.3f} ms")


if __name__ == "__main__":
    main()
