"""The one-command launcher as a user runs it: a real `python -m launcher` process, real HTTP.

A dead service is restarted and serving resumes; Ctrl-C (SIGINT to the launcher's whole process group,
as a terminal sends it) stops every service cleanly, and a request in flight gets 503, never a 500.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import httpx

from launcher.ports import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split()[2] != "Z"


def completion(url: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60,
                      json={"prompt": "def add(a, b):", "max_tokens": max_tokens, "temperature": 0})


def test_restart_of_a_killed_worker_and_clean_ctrl_c(tmp_path: pathlib.Path) -> None:
    ports = {k: free_port() for k in ("http", "cache", "worker", "scheduler")}
    out = tmp_path / "launcher.out"
    argv = [sys.executable, "-m", "launcher", "--device", "cpu", "--dtype", "float32", "--kv-tokens", "4096",
            "--http-port", str(ports["http"]), "--cache-port", str(ports["cache"]),
            "--worker-port", str(ports["worker"]), "--scheduler-port", str(ports["scheduler"])]
    with open(out, "wb") as sink:
        launcher = subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    pids: dict[str, int] = {}
    try:
        banner = wait_for(lambda: re.search(r"processes: (.*?);", out.read_text()), 180, "the serving banner")
        pids = {k: int(v) for k, v in (kv.split("=") for kv in banner.group(1).split(", "))}
        url = f"http://127.0.0.1:{ports['http']}"
        assert completion(url).status_code == 200

        os.kill(pids["worker"], signal.SIGKILL)
        wait_for(lambda: "worker is back" in out.read_text(), 120, "the worker's restart")
        assert launcher.poll() is None
        reply = wait_for(lambda: (r := completion(url)).status_code == 200 and r, 60, "serving after the restart")
        assert reply.json()["usage"]["completion_tokens"] == 4

        results: list[httpx.Response] = []
        long = threading.Thread(target=lambda: results.append(completion(url, max_tokens=3000)))
        long.start()
        time.sleep(1.0)
        os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert launcher.wait(timeout=90) == 0
        long.join(timeout=60)
        text = out.read_text()
        codes = re.search(r"stopped: \{(.*)\}", text).group(1)
        assert all(code.strip().endswith(": 0") for code in codes.split(",")), codes
        assert results and results[0].status_code in (200, 503), results[0].text
        pids["worker"] = int(re.search(r"worker is back \(pid (\d+)\)", text).group(1))
        assert not any(alive(pid) for pid in pids.values())
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_service_env_keeps_the_callers_pythonpath_after_the_repository():
    """Packages on the caller's PYTHONPATH (e.g. wheels installed with pip --target) stay importable in the
    services; the repository comes first. Was: PYTHONPATH replaced by the repository alone."""
    import os

    from launcher.stack import ROOT, service_env

    env = service_env({"PYTHONPATH": "/opt/site", "HOME": "/root"})
    assert env["PYTHONPATH"] == f"{ROOT}{os.pathsep}/opt/site"
    assert env["HOME"] == "/root" and env["PYTHONUNBUFFERED"] == "1"
    assert service_env({})["PYTHONPATH"] == str(ROOT)
