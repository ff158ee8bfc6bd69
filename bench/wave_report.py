"""Where the device's idle time between two waves of requests goes: the worker's Forward timeline joined with the
requests' hops (``serve_bench --hop-trace DIR``: every service's and the client's marks, ``common/hop_trace.py``).

    python -m bench.wave_report FORWARDS_TSV HOP_DIR [--min-gap-ms 10] [--json]

A fixed-length phase (``serve_bench``'s cN: every request has the same prompt and output length) runs in waves: the
requests of a wave finish in the same decode Forward, the client sends the next wave's as each one ends, and the
device idles from the end of that decode Forward until the next wave's first extend. For every decode -> extend gap
of at least ``--min-gap-ms`` the report gives, per hop, when the requests reached it in ms after the device went
idle (first / median / last of the requests that reached it inside the window): the end of the finishing wave
(``final_message`` .. ``client_done``: the requests whose last message was built within 100 ms before the idle start
or inside the gap) and the start of the next one (``client_sent`` .. ``forward_in``: the requests the client sent
inside the gap). All times are ``time.monotonic_ns`` (one clock for every process of the machine).
"""

from __future__ import annotations

import argparse
import json
import statistics

from bench import forward_timeline, hop_report

END_HOPS = ("final_message", "last_yield", "last_message", "done_chunk", "client_done")
START_HOPS = ("client_sent", "http_in", "call", "generate", "taken", "match_sent", "match_back", "admitted",
              "extend_sent", "forward_in", "forward_run", "first_token", "client_text")


def _spread(values: list[float]) -> dict:
    return {"n": len(values), "first": min(values), "p50": statistics.median(values), "last": max(values)}


def gaps(fwds: list[forward_timeline.Fwd], min_gap_ms: float) -> list[tuple[int, int]]:
    """(idle start, idle end) in ns of every decode -> extend gap of at least ``min_gap_ms`` on the device
    (``fwds`` by device start: ``forward_timeline.read``)."""
    return [(a.end, b.start) for a, b in zip(fwds, fwds[1:])
            if a.kind == "decode" and b.kind == "extend" and b.start - a.end >= min_gap_ms * 1e6]


def wave(hops: dict[str, dict[str, int]], idle: tuple[int, int]) -> dict:
    """One gap: its length and, per hop, the spread of the times (ms after the idle start) the requests of the
    ending and of the starting wave reached it."""
    t0, t1 = idle
    ending = [m for m in hops.values() if "final_message" in m and t0 - 100e6 <= m["final_message"] <= t1]
    starting = [m for m in hops.values() if "client_sent" in m and t0 <= m["client_sent"] <= t1]
    rows = {}
    for name, group, hop_names in (("end", ending, END_HOPS), ("start", starting, START_HOPS)):
        for hop in hop_names:
            ts = [(m[hop] - t0) / 1e6 for m in group if hop in m]
            if ts:
                rows[f"{name} {hop}"] = _spread(ts)
    return {"gap_ms": (t1 - t0) / 1e6, "ending": len(ending), "starting": len(starting), "hops": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("forwards")
    p.add_argument("hop_dir")
    p.add_argument("--min-gap-ms", type=float, default=10.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    hops = hop_report.load(a.hop_dir)
    waves = [wave(hops, g) for g in gaps(forward_timeline.read(a.forwards), a.min_gap_ms)]
    if a.json:
        print(json.dumps(waves, indent=1))
        return
    for i, w in enumerate(waves):
        print(f"gap {i}: {w['gap_ms']:.1f} ms idle, {w['ending']} requests ending, {w['starting']} sent inside")
        for name, s in w["hops"].items():
            print(f"  {name:20s} n={s['n']:4d}  first {s['first']:8.2f}  p50 {s['p50']:8.2f}  last {s['last']:8.2f} ms")


if __name__ == "__main__":
    main()
