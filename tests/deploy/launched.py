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

from launcher.ports import free_ports

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


def start(tmp_path: pathlib.Path, flags: tuple[str, ...]) -> Launched:
    """Starts ``python -m launcher`` on free ports and waits for its banner (at most 200 s). Raises
    AssertionError with the launcher's output when it exits first or the banner does not come; PortTaken when
    it exited because one of the ports picked here was taken meanwhile (the pick-then-bind race)."""
    ports = dict(zip(("http", "cache", "worker", "scheduler"), free_ports(4)))
    argv = [sys.executable, "-m", "launcher", "--device", "cpu", "--dtype", "float32", "--kv-tokens", "4096",
            "--start-timeout", "180", *(a for name, port in ports.items() for a in (f"--{name}-port", str(port))), *flags]
    out = tmp_path / f"launcher-{len(list(tmp_path.glob('launcher-*.out')))}.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    run = Launched(proc, argv, out, ports["http"])

    def banner_or_exit():
        found = re.search(r"processes: (.*?); logs in (.*?);", run.text())
        return found or (proc.poll() is not None and "exited")

    try:
        # 200 s: past the launcher's 180 s per service (--start-timeout above), so its StartupError (with the log tail) shows
        banner = wait_for(banner_or_exit, 200, "the serving banner")
    except AssertionError as exc:
        kill(run)
        raise AssertionError(f"{exc}; the launcher printed:\n{run.text()[-4000:]}") from exc
    if banner == "exited":
        if re.search(r"port \S+ is in use", run.text()):
            raise PortTaken(run.text())
        raise AssertionError(f"the launcher exited with {proc.returncode} before its banner:\n{run.text()[-4000:]}")
    run.pids.update({k: int(v) for k, v in (kv.split("=") for kv in banner.group(1).split(", "))})
    run.log_dir = pathlib.Path(banner.group(2))
    return run


class PortTaken(Exception):
    """The launcher refused a port that another process took after ``free_port`` picked it."""


def kill(run: Launched) -> None:
    """SIGKILLs the launcher's group and every service PID it reported."""
    if run.proc.poll() is None:
        os.killpg(run.proc.pid, signal.SIGKILL)
    for pid in run.pids.values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def launched(tmp_path: pathlib.Path, *flags: str) -> Iterator[Launched]:
    """Runs ``python -m launcher`` on free ports (CPU, float32, 4096 KV tokens, then ``flags``) until it prints
    its banner (``start``; tried again on fresh ports, up to 3 times, when a picked port was taken meanwhile);
    afterwards SIGKILLs whatever of it is still alive."""
    for attempt in range(3):
        try:
            run = start(tmp_path, flags)
            break
        except PortTaken:
            if attempt == 2:
                raise
    try:
        yield run
    finally:
        kill(run)
