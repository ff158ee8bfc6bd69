"""The one-command launcher as a user runs it: a real `python -m launcher` process, real HTTP.

A dead service is restarted and serving resumes; Ctrl-C (SIGINT to the launcher's whole process group,
as a terminal sends it) stops every service cleanly, and a request in flight gets 503, never a 500.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import threading
import time

import httpx

from tests.deploy.launched import alive, launched, wait_for


def completion(url: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60,
                      json={"prompt": "def add(a, b):", "max_tokens": max_tokens, "temperature": 0})


def test_restart_of_a_killed_worker_and_clean_ctrl_c(tmp_path: pathlib.Path) -> None:
    with launched(tmp_path) as run:
        assert completion(run.url).status_code == 200

        os.kill(run.pids["worker"], signal.SIGKILL)
        wait_for(lambda: "worker is back" in run.text(), 120, "the worker's restart")
        assert run.proc.poll() is None
        run.pids["worker"] = int(re.search(r"worker is back \(pid (\d+)\)", run.text()).group(1))
        reply = wait_for(lambda: (r := completion(run.url)).status_code == 200 and r, 60, "serving after the restart")
        assert reply.json()["usage"]["completion_tokens"] == 4

        results: list[httpx.Response] = []
        long = threading.Thread(target=lambda: results.append(completion(run.url, max_tokens=3000)))
        long.start()
        time.sleep(1.0)
        run.interrupt()
        long.join(timeout=60)
        assert results and results[0].status_code in (200, 503), results[0].text
        assert not any(alive(pid) for pid in run.pids.values())


def test_service_env_keeps_the_callers_pythonpath_after_the_repository():
    """Packages on the caller's PYTHONPATH (e.g. wheels installed with pip --target) stay importable in the
    services; the repository comes first. Was: PYTHONPATH replaced by the repository alone."""
    import os

    from launcher.stack import ROOT, service_env

    env = service_env({"PYTHONPATH": "/opt/site", "HOME": "/root"})
    assert env["PYTHONPATH"] == f"{ROOT}{os.pathsep}/opt/site"
    assert env["HOME"] == "/root" and env["PYTHONUNBUFFERED"] == "1"
    assert service_env({})["PYTHONPATH"] == str(ROOT)


def test_a_stacks_env_reaches_its_services_over_the_callers():
    """``Stack.env`` (the soak's allocator settings) overrides the caller's variables in every service's environment,
    but not the repository's PYTHONPATH or unbuffered output. Was: no way to set a variable for the services alone."""
    from launcher.stack import ROOT, service_env

    env = service_env({"MALLOC_ARENA_MAX": "8", "HOME": "/root"}, {"MALLOC_ARENA_MAX": "2", "PYTHONPATH": "/x"})
    assert env["MALLOC_ARENA_MAX"] == "2" and env["HOME"] == "/root"
    assert env["PYTHONPATH"] == str(ROOT) and env["PYTHONUNBUFFERED"] == "1"
