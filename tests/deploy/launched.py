"""A real ``python -m launcher`` process for the deploy tests: free ports, its output in a file, the service PIDs
from its banner, and a cleanup that leaves no process behind."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from launcher.ports import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float, what: str):
    """The first truthy value of ``predicate()``, polled every 0.2 s; AssertionError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split()[2] != "Z"


@dataclass
class Launched:
    """A launcher run that printed its serving banner. ``pids``: service name -> PID (update it when the
    launcher restarts one, so the cleanup finds it); ``argv``: the launcher's command line."""

    proc: subprocess.Popen
    argv: list[str]
    out: pathlib.Path
    http_port: int
    pids: dict[str, int] = field(default_factory=dict)
    log_dir: pathlib.Path = pathlib.Path()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def text(self) -> str:
        """What the launcher printed so far."""
        return self.out.read_text()

    def interrupt(self, timeout: float = 90.0) -> None:
        """Ctrl-C as a terminal sends it (SIGINT to the launcher's process group); asserts the launcher and
        every service exited 0."""
        os.killpg(self.proc.pid, signal.SIGINT)
        assert self.proc.wait(timeout=timeout) == 0
        codes = re.search(r"stopped: \{(.*)\}", self.text()).group(1)
        assert all(code.strip().endswith(": 0") for code in codes.split(",")), codes


@contextmanager
def launched(tmp_path: pathlib.Path, *flags: str) -> Iterator[Launched]:
    """Runs ``python -m launcher`` on free ports (CPU, float32, 4096 KV tokens, then ``flags``) until it prints
    its banner (at most 180 s); afterwards SIGKILLs whatever of it is still alive."""
    ports = {name: free_port() for name in ("http", "cache", "worker", "scheduler")}
    argv = [sys.executable, "-m", "launcher", "--device", "cpu", "--dtype", "float32", "--kv-tokens", "4096",
            *(a for name, port in ports.items() for a in (f"--{name}-port", str(port))), *flags]
    out = tmp_path / "launcher.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    run = Launched(proc, argv, out, ports["http"])
    try:
        banner = wait_for(lambda: re.search(r"processes: (.*?); logs in (.*?);", run.text()), 180,
                          "the serving banner")
        run.pids.update({k: int(v) for k, v in (kv.split("=") for kv in banner.group(1).split(", "))})
        run.log_dir = pathlib.Path(banner.group(2))
        yield run
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in run.pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
