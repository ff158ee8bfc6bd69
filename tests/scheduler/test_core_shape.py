"""The shape of the scheduler's core (issue 10), checked on the source: imports run one way (no cycle, imports
under TYPE_CHECKING included), only the request table releases a request at the cache, and every file is
short enough to read in one sitting."""

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[2] / "scheduler_svc"
MAX_LINES = 400


def import_graph() -> dict[str, set[str]]:
    """module -> the scheduler_svc modules it imports (anywhere in the file)."""
    mods = {p.stem for p in PKG.glob("*.py")}
    graph = {}
    for path in PKG.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scheduler_svc"):
                parts = node.module.split(".")
                deps.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("scheduler_svc."))
        graph[path.stem] = deps & mods
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a list of modules ([] when there is none)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> list[str]:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep, stack + [dep])):
                return found
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return []


def test_no_import_cycle_in_scheduler_svc():
    graph = import_graph()
    assert cycle(graph) == []
    assert graph["scheduler"] >= {"requests", "planner", "pipeline", "results", "recovery"}
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one


def test_the_pipeline_imports_nothing_of_the_scheduler():
    assert import_graph()["pipeline"] <= {"batch", "request", "worker_client", "errors", "rpc"}


def test_only_the_request_table_releases_requests_at_the_cache_and_the_worker():
    for call in (".release_requests(", ".cache_requests(", ".defer_cache(", ".defer_release(", ".flush_deferred(",
                 "worker.release("):
        callers = sorted(p.name for p in PKG.glob("*.py") if call in p.read_text())
        assert (call, callers) == (call, ["requests.py"])


def test_no_file_over_400_lines():
    assert {p.name: n for p in PKG.glob("*.py") if (n := len(p.read_text().splitlines())) >= MAX_LINES} == {}
