"""``python -m gateway --workers 2`` as real processes in front of the fake scheduler (gateway/workers.py): both
children serve the one port, the error count is the sum over both whichever child answers the scrape, SIGTERM
drains both and the parent exits 0, and a child that dies makes the whole gateway exit 1 (not half a gateway)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tools.gen_protos import ROOT
from worker_svc.model.default import ensure_default_model


@pytest.fixture(scope="module")
def model_dir():
    return ensure_default_model()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(model_dir, fake_server, tmp_path: pathlib.Path, *flags: str, workers: int = 2, preexec=None,
           ) -> tuple[subprocess.Popen, str, list[int], pathlib.Path]:
    """A gateway process of ``workers`` children, once each logged "serving": (process, url, child pids, hop dir).
    The process is killed if it does not get there."""
    port = _free_port()
    log_path, hops = tmp_path / "gateway.log", tmp_path / "hops"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
             "--scheduler", f"127.0.0.1:{fake_server[1].port}", "--model-path", str(model_dir),
             "--model-name", "codeserve-default", "--drain-seconds", "2", *flags],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "CODESERVE_HOP_TRACE": str(hops)})
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()
            serving = [json.loads(line) for line in log_path.read_text().splitlines()
                       if line.startswith("{") and '"serving"' in line]
            if len(serving) == workers:
                break
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.005)
        pids = sorted(s["pid"] for s in serving)
        assert len(set(pids)) == workers and all(s["port"] == port for s in serving)
        assert workers == 1 or proc.pid not in pids
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return proc, f"http://127.0.0.1:{port}", pids, hops


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _one(url: str, i: int) -> int:
    with httpx.Client() as client:  # a connection of its own: the kernel hands it to one child
        if i % 4 == 0:  # refused at the gateway (no Generate call): counted in codeserve:request_errors
            return client.post(f"{url}/generate", content=b"{not json").status_code
        return client.post(f"{url}/generate", json={"text": f"def f{i}():", "sampling_params": {
            "max_new_tokens": 2, "temperature": 0}}).status_code


def _errors(url: str) -> float:
    with httpx.Client() as client:
        text = client.get(f"{url}/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(r'^codeserve:request_errors_total\{[^}]*status="400"[^}]*\} (\S+)$',
                                                       text, re.M))


def test_two_workers_serve_one_port_and_count_errors_together(model_dir, fake_server, fake, tmp_path):
    proc, url, pids, hops = _start(model_dir, fake_server, tmp_path)
    try:
        with ThreadPoolExecutor(32) as pool:
            codes = list(pool.map(lambda i: _one(url, i), range(96)))
        assert codes.count(400) == 24 and codes.count(200) == 72, codes
        # both children took requests (their hop traces: one file each, named by pid)
        served = {int(p.name.split(".")[1]) for p in hops.glob("gateway.*.tsv") if p.read_text().strip()}
        assert served == set(pids), (served, pids)
        # every scrape, whichever child answers it, reports the 24 of both
        assert {_errors(url) for _ in range(8)} == {24.0}
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, (tmp_path / "gateway.log").read_text()
    assert not any(_alive(pid) for pid in pids)


def test_a_child_that_dies_stops_the_gateway_with_a_failure(model_dir, fake_server, fake, tmp_path):
    proc, url, pids, _ = _start(model_dir, fake_server, tmp_path)
    try:
        os.kill(pids[0], signal.SIGKILL)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 1, (tmp_path / "gateway.log").read_text()
    assert not _alive(pids[1])
    log = (tmp_path / "gateway.log").read_text()
    assert '"worker_exited"' in log and f'"pid": {pids[0]}' in log


def test_workers_out_of_range_or_with_several_replicas_is_a_usage_error(model_dir):
    for flags, message in ((["--workers", "0"], "--workers must be in 1..64 (got 0)"),
                           (["--workers", "65"], "--workers must be in 1..64 (got 65)"),
                           (["--workers", "2", "--replica", "scheduler=127.0.0.1:1,cache=127.0.0.1:3,pool=a",
                             "--replica", "scheduler=127.0.0.1:2,cache=127.0.0.1:3,pool=b"],
                            "--workers > 1 serves one replica only")):
        r = subprocess.run([sys.executable, "-m", "gateway", "--model-path", str(model_dir), *flags],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and message in r.stderr, r.stderr


def test_sigterm_while_the_children_still_start_stops_all_cleanly(model_dir, fake_server, fake, tmp_path):
    """SIGTERM right after the children were forked (they load the tokenizer, build their apps): all of them stop
    and the parent exits 0, whether a child had its handlers yet or not."""
    log_path = tmp_path / "gateway.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", "0", "--workers", "3",
             "--scheduler", f"127.0.0.1:{fake_server[1].port}", "--model-path", str(model_dir)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        while '"workers_started"' not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.01)
        started = next(json.loads(line) for line in log_path.read_text().splitlines() if '"workers_started"' in line)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log_path.read_text()
    assert len(started["pids"]) == 3 and not any(_alive(pid) for pid in started["pids"])


def test_a_killed_parent_takes_its_children_and_frees_the_port(model_dir, fake_server, fake, tmp_path):
    """SIGKILL of the parent (no chance to pass anything on): each child gets SIGTERM from the kernel, drains and
    exits, and the port can be bound again, so a restarted gateway does not fail on its own orphans."""
    import socket

    proc, url, pids, _ = _start(model_dir, fake_server, tmp_path)
    port = int(url.rsplit(":", 1)[1])
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, [p for p in pids if _alive(p)]
        time.sleep(0.05)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free again: no child holds it


def _sockets(pid: int) -> int:
    """Sockets among the open file descriptors of ``pid``."""
    fds = pathlib.Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("socket:"))


def test_sigint_reaches_children_that_ignore_it_and_the_parent_holds_no_socket(model_dir, fake_server, fake,
                                                                              tmp_path):
    """A gateway started with SIGINT ignored (a script's `cmd &`): SIGINT to the parent still stops every child (the
    parent passes SIGTERM on) and it exits 0. The parent keeps no copy of the listening socket once its children
    have theirs, so a connection made while they drain is refused rather than left waiting in a backlog."""
    proc, url, pids, _ = _start(model_dir, fake_server, tmp_path,
                                preexec=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert _sockets(proc.pid) == 0
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, (tmp_path / "gateway.log").read_text()
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_right_after_serving_is_not_lost(model_dir, fake_server, fake, tmp_path, workers):
    """SIGTERM at once after the "serving" line, before uvicorn has taken the signals over: the gateway still stops
    (exit 0) instead of serving on with the signal lost. Five times each."""
    for _ in range(5):
        proc, _, pids, _ = _start(model_dir, fake_server, tmp_path, workers=workers)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(15)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert code == 0, (tmp_path / "gateway.log").read_text()
