"""Where the device's time goes across a served workload: a report of the worker's Forward timeline.

Input: the file a worker wrote with ``CODESERVE_FORWARD_LOG=PATH`` (``worker_svc/forward_log.py``: one line per
Forward, its device span on the host's monotonic clock). The timeline is cut into segments wherever the device
idles longer than ``--split-s`` (the phases of a benchmark: c64, then c1, ...). For each segment:

- wall (first launch to last step end), the device's busy time (the union of the Forwards' spans) and its share;
- per kind (``decode``, ``extend``): Forwards, rows, tokens, device time, how many were launched behind the one
  ahead (``behind``; logs from session 28 on);
- the gaps between consecutive Forwards, by the pair of kinds around them, each split in two: ``late``, the part
  before the next Forward reached the worker's servicer (the scheduler had not sent it yet, or it was in
  transit), and ``worker``, the part after (the worker had it: its turn, validation, metadata, plan, launch);
  ``prepared_late``: those whose next Forward's preparation at arrival ended only after the device went idle (it
  reached the worker too late to be prepared and launched behind in time);
- per kind and launch (``decode turn``, ``decode behind``, ...), the p50 of each stage's time on the worker (the
  ``marks`` column, logs from session 29 on: from arrival to ``items``, from each mark to the next, from the last
  to the reply, ``out``): where the host time between arrival and launch, and after the device's end, goes.

``bench/serve_bench.py`` turns the log on for its worker and adds ``summarize`` of each phase's window to the
phase's results (``timeline``; the table's ``busy`` column).

Usage: ``python -m bench.forward_timeline PATH [--split-s 1.0] [--json OUT] [--list KIND[:MIN_ROWS]]``. Prints a
table; ``--json`` keeps the figures; ``--list`` then prints the Forwards of that kind (of at least MIN_ROWS rows) one
by one (``listing``: the device's idle before each, its arrival against the end of the Forward ahead, its marks),
and where the idle before those that took their turn went (``turn_handoffs``).
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Fwd:
    """One logged Forward (times in ns, ``time.monotonic_ns()``'s clock)."""

    seq: int
    kind: str
    rows: int
    tokens: int
    steps: int
    in_ns: int
    start: int
    end: int
    prepared_ns: int = -1  # when its preparation at arrival ended (-1: none, or a log from before session 28)
    behind: bool = False  # launched behind the Forward ahead
    marks: tuple[tuple[str, int], ...] = ()  # (stage, us after in_ns) of each mark, in order (session 29 on)
    out_ns: int = -1  # when its reply was built


def read(path: str) -> list[Fwd]:
    """The Forwards of ``path`` that ran on the device, by device start. Raises OSError / KeyError / ValueError on
    an unreadable file or a malformed line."""
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    out = [Fwd(int(r["seq"]), r["kind"], int(r["rows"]), int(r["tokens"]), int(r["steps"]), int(r["in_ns"]),
               int(r["dev_start_ns"]), int(r["dev_end_ns"]), int(r.get("prepared_ns") or -1),
               r.get("launch") == "behind", parse_marks(r.get("marks") or ""), int(r["out_ns"]))
           for r in rows if int(r["dev_start_ns"]) >= 0]
    return sorted(out, key=lambda f: f.start)


def parse_marks(text: str) -> tuple[tuple[str, int], ...]:
    """The ``marks`` column (``name:us,name:us``) as ((name, us), ...); raises ValueError on a malformed one."""
    return tuple((name, int(us)) for name, _, us in (m.partition(":") for m in text.split(",") if m))


def stages(seg: list[Fwd]) -> dict[str, dict[str, float]]:
    """Per ``kind launch`` (``decode turn``, ...), the p50 (ms) of each stage: arrival -> first mark, each mark ->
    the next (named by the later one), last mark -> reply (``out``); only Forwards with marks."""
    by: dict[str, dict[str, list[float]]] = {}
    for f in seg:
        if not f.marks:
            continue
        d = by.setdefault(f"{f.kind} {'behind' if f.behind else 'turn'}", {})
        last = 0
        for name, us in f.marks:
            d.setdefault(name, []).append((us - last) / 1e3)
            last = us
        if f.out_ns >= 0:
            d.setdefault("out", []).append(((f.out_ns - f.in_ns) / 1e3 - last) / 1e3)
    return {k: {name: _p50(xs) for name, xs in d.items()} for k, d in by.items()}


def within(fwds: list[Fwd], start_ns: int, end_ns: int) -> list[Fwd]:
    """The Forwards whose device span lies inside [start_ns, end_ns] (a benchmark phase's window)."""
    return [f for f in fwds if start_ns <= f.start and f.end <= end_ns]


def segments(fwds: list[Fwd], split_ns: int) -> list[list[Fwd]]:
    """``fwds`` cut wherever the device idles longer than ``split_ns``."""
    out: list[list[Fwd]] = []
    last_end = None
    for f in fwds:
        if last_end is None or f.start - last_end > split_ns:
            out.append([])
        out[-1].append(f)
        last_end = f.end if last_end is None else max(last_end, f.end)
    return out


def head_tail(fwds: list[Fwd], requests: list[tuple[float, float]]) -> dict:
    """Where a phase's wall time is outside its Forwards (ms): ``head_ms`` from the first request sent to the first
    Forward's device start, ``tail_ms`` from the last Forward's device end to the last request answered. ``requests``:
    (sent, done) of each answered request, ``time.monotonic()`` seconds (``bench.loadgen.Record``: the clock of the
    Forwards' ``*_ns``, system-wide on Linux). Empty when either list is."""
    if not fwds or not requests:
        return {}
    first_sent = min(s for s, _ in requests) * 1e9
    last_done = max(d for _, d in requests) * 1e9
    return {"head_ms": (min(f.start for f in fwds) - first_sent) / 1e6,
            "tail_ms": (last_done - max(f.end for f in fwds)) / 1e6}


def _p50(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def summarize(seg: list[Fwd]) -> dict:
    """The figures of one segment (ms unless named otherwise; ``seg`` sorted by device start, not empty)."""
    wall = max(f.end for f in seg) - seg[0].start
    busy = 0
    cover_end = seg[0].start
    for f in seg:  # union of spans (sorted by start)
        if f.end > cover_end:
            busy += f.end - max(f.start, cover_end)
            cover_end = f.end
    kinds: dict[str, dict] = {}
    for f in seg:
        k = kinds.setdefault(f.kind, {"forwards": 0, "rows": 0, "tokens": 0, "device_ms": 0.0, "behind": 0})
        k["forwards"] += 1
        k["behind"] += f.behind
        k["rows"] += f.rows
        k["tokens"] += f.tokens
        k["device_ms"] += (f.end - f.start) / 1e6
    gaps: dict[str, dict] = {}
    cover_end = seg[0].end
    for prev, nxt in zip(seg, seg[1:]):
        cover_end = max(cover_end, prev.end)
        gap = nxt.start - cover_end
        if gap <= 0:
            continue
        late = min(gap, max(0, nxt.in_ns - cover_end))
        g = gaps.setdefault(f"{prev.kind}->{nxt.kind}", {"n": 0, "ms": 0.0, "late_ms": 0.0, "worker_ms": 0.0, "all": [],
                                                        "prepared_late": 0})
        g["n"] += 1
        g["prepared_late"] += nxt.prepared_ns > cover_end  # arrived in time, but its preparation ended after
        g["ms"] += gap / 1e6
        g["late_ms"] += late / 1e6
        g["worker_ms"] += (gap - late) / 1e6
        g["all"].append(gap / 1e6)
    for g in gaps.values():
        g["p50_ms"] = _p50(g.pop("all"))
    return {"wall_ms": wall / 1e6, "busy_ms": busy / 1e6, "busy_share": busy / wall if wall else 0.0,
            "forwards": len(seg), "kinds": kinds, "gaps": gaps, "stages_p50_ms": stages(seg)}


def listing(fwds: list[Fwd], kind: str, min_rows: int = 0) -> list[str]:
    """One line per Forward of ``kind`` with at least ``min_rows`` rows (not the first of the log), in device order:
    its launch (``behind`` / ``turn``), the kind of the Forward ahead on the device, the device's idle before it (ms),
    its arrival at the worker against that one's end (ms; negative: before it ended, positive: the device waited for
    it to arrive) and its marks (stage: ms after arrival). Run 32 read c256's 256-row decodes so
    (bench/results/h200-run32/call1/c256_decodes.txt)."""
    lines = []
    for ahead, f in zip(fwds, fwds[1:]):
        if f.kind != kind or f.rows < min_rows:
            continue
        marks = " ".join(f"{name} {us / 1e3:.1f}" for name, us in f.marks)
        lines.append(f"seq {f.seq} {f.kind} rows {f.rows:>4} {'behind' if f.behind else 'turn':6s} ahead "
                     f"{ahead.kind:6s} idle {(f.start - ahead.end) / 1e6:6.1f} arrived {(f.in_ns - ahead.end) / 1e6:7.1f}"
                     f"  {marks}")
    return lines


HANDOFF = ("commit_ahead", "handoff", "launch", "idle")


def turn_handoffs(fwds: list[Fwd], kind: str, min_rows: int = 0) -> dict:
    """Where the device's idle before each Forward of ``kind`` (at least ``min_rows`` rows) that took its turn
    behind another of its kind went, from their marks: ``commit_ahead`` the one ahead's commit (its ``woke`` to its
    ``committed``), ``handoff`` from that commit to this one's ``turn`` (its thread taking the lock: run 33 read 3.6-4.9
    ms at c256 on an H100), ``launch`` from its turn to its ``launched``, ``idle`` the device's (the one ahead's end
    to its start). Returns {"n", and per part {"p50_ms", "ms"}} (n 0: none had those marks)."""
    parts: dict[str, list[float]] = {k: [] for k in HANDOFF}
    for ahead, f in zip(fwds, fwds[1:]):
        m, am = dict(f.marks), dict(ahead.marks)
        if (f.kind != kind or f.rows < min_rows or f.behind or ahead.kind != kind or "turn" not in m
                or "launched" not in m or "woke" not in am or "committed" not in am):
            continue
        committed = ahead.in_ns + 1000 * am["committed"]
        parts["commit_ahead"].append((am["committed"] - am["woke"]) / 1e3)
        parts["handoff"].append((f.in_ns + 1000 * m["turn"] - committed) / 1e6)
        parts["launch"].append((m["launched"] - m["turn"]) / 1e3)
        parts["idle"].append((f.start - ahead.end) / 1e6)
    return {"n": len(parts["idle"]), **{k: {"p50_ms": _p50(v), "ms": sum(v)} for k, v in parts.items()}}


def table(summaries: list[dict]) -> str:
    """The segments' figures as text."""
    lines = []
    for i, s in enumerate(summaries):
        lines.append(f"segment {i}: {s['forwards']} Forwards, wall {s['wall_ms']:.1f} ms, device busy "
                     f"{s['busy_ms']:.1f} ms ({100 * s['busy_share']:.1f}%)")
        for k, v in sorted(s["kinds"].items()):
            lines.append(f"  {k:<8} {v['forwards']:>5} Forwards {v['rows']:>7} rows {v['tokens']:>8} tokens "
                         f"{v['device_ms']:>9.1f} ms on the device, {v.get('behind', 0)} launched behind")
        for k, g in sorted(s["gaps"].items(), key=lambda kv: -kv[1]["ms"]):
            lines.append(f"  gap {k:<16} {g['n']:>5} x  {g['ms']:>8.1f} ms (p50 {g['p50_ms']:.3f}): late "
                         f"{g['late_ms']:.1f}, worker {g['worker_ms']:.1f}; prepared after the device idled: "
                         f"{g.get('prepared_late', 0)}")
        for k, st in sorted(s.get("stages_p50_ms", {}).items()):
            lines.append(f"  stages {k:<14} p50 ms: " + ", ".join(f"{name} {ms:.2f}" for name, ms in st.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="a CODESERVE_FORWARD_LOG file")
    ap.add_argument("--split-s", type=float, default=1.0, help="device idle (s) that starts a new segment")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--list", default=None, metavar="KIND[:MIN_ROWS]",
                    help="then the Forwards of that kind (of at least MIN_ROWS rows) one by one")
    a = ap.parse_args(argv)
    fwds = read(a.path)
    summaries = [summarize(seg) for seg in segments(fwds, int(a.split_s * 1e9))]
    print(table(summaries))
    if a.list:
        kind, _, rows = a.list.partition(":")
        if kind not in {f.kind for f in fwds} or (rows and not rows.isdigit()):
            ap.error(f"--list takes KIND[:MIN_ROWS] with a kind in the log ({sorted({f.kind for f in fwds})}), "
                     f"got {a.list!r}")
        print("\n".join(listing(fwds, kind, int(rows or 0))))
        h = turn_handoffs(fwds, kind, int(rows or 0))
        print(f"{h['n']} at their turn behind one of their kind; p50 / sum ms: "
              + ", ".join(f"{k} {h[k]['p50_ms']:.2f} / {h[k]['ms']:.1f}" for k in HANDOFF))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"source": a.path, "split_s": a.split_s, "segments": summaries}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
