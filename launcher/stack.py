"""A running local deployment: cache, each replica's worker and scheduler, gateway: processes started in order, each
waited on until ready."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from launcher.config import StackConfig, commands
from launcher.ports import ensure_free, free_ports, service_ports
from launcher.replicas import Replica, layout

ROOT = pathlib.Path(__file__).resolve().parents[1]


class StartupError(RuntimeError):
    """A service exited or did not become ready in time; the message names it and its last log lines."""


class StartupInterrupted(Exception):
    """``Stack.interrupt`` was set (Ctrl-C / SIGTERM) while a service was starting; the message names it. Not a
    StartupError: a requested stop, not a failure."""


def grpc_serving(target: str, timeout: float = 1.0) -> bool:
    """True when ``target`` answers grpc.health.v1 Check("") with SERVING; False when unreachable or not serving."""
    with grpc.insecure_channel(target) as chan:
        try:
            reply = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def http_live(url: str, timeout: float = 1.0) -> bool:
    """True when GET ``url`` answers 200; False on a connection error or another status."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.TransportError:
        return False


def service_env(environ, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a service process: the caller's, then ``extra`` (``Stack.env``), unbuffered output, and
    the repository first on PYTHONPATH with the caller's PYTHONPATH kept after it (packages installed with
    ``pip --target`` and put on PYTHONPATH must stay importable in the services)."""
    kept = environ.get("PYTHONPATH", "")
    return {**environ, **(extra or {}), "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT) + (os.pathsep + kept if kept else "")}


@dataclass
class Stack:
    """Starts and stops the services: cache, each replica's worker and scheduler (``launcher.replicas``; one
    replica: ``worker``, ``scheduler``), gateway. Ports of 0 are replaced by free ones: ``ports`` holds each
    process's port, and ``cfg`` the first replica's (so ``cfg`` describes a one-replica stack exactly).

    ``env`` is added to every service's environment (``service_env``). Logs of each service go to
    ``log_dir/<name>.log``. Use as a context manager or call start()/stop().
    Setting ``interrupt`` (the launcher's signal handler does) makes a start in progress raise
    StartupInterrupted within about a second; the services already started keep running until stop().
    """

    cfg: StackConfig
    log_dir: pathlib.Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    model_path: str = ""
    interrupt: threading.Event = field(default_factory=threading.Event)
    ports: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wanted = service_ports(self.cfg)
        picked = iter(free_ports(sum(1 for port in wanted.values() if not port), self.cfg.bind_host))
        self.ports = {name: port or next(picked) for name, port in wanted.items()}
        first = self.replicas[0]
        self.cfg = dataclasses.replace(self.cfg, http_port=self.ports["gateway"], cache_port=self.ports["cache"],
                                       worker_port=self.ports[first.worker],
                                       scheduler_port=self.ports[first.scheduler])

    @property
    def replicas(self) -> list[Replica]:
        """The replicas' names, in order (``launcher.replicas.layout``)."""
        return layout(self.cfg.replicas)

    @property
    def services(self) -> tuple[str, ...]:
        """Every process name, in start order."""
        return tuple(self.ports)

    def commands(self) -> dict[str, list[str]]:
        """The argv of each process on this stack's ports (``launcher.config.commands``)."""
        return commands(self.cfg, self.model_path, ports=self.ports)

    @property
    def url(self) -> str:
        return f"http://{self.cfg.bind_host}:{self.cfg.http_port}"

    def target(self, name: str) -> str:
        """host:port of a gRPC service process ("cache", "worker", "scheduler", "worker-1", ...)."""
        return f"{self.cfg.bind_host}:{self.ports[name]}"

    def ready(self, name: str) -> bool:
        if name == "gateway":
            return http_live(self.url + "/health")
        return grpc_serving(self.target(name))

    def start(self, timeout: float | None = None, only: tuple[str, ...] | None = None) -> "Stack":
        """Starts the services named in ``only`` (default: all, ``services``) in order, each waited on until ready.

        Raises StartupError (naming the service and the tail of its log) when one exits or is not
        ready within ``timeout`` seconds (None: the config's ``start_timeout``); RuntimeError when a port is already held (naming the PIDs);
        StartupInterrupted when ``interrupt`` is set meanwhile.
        """
        if not self.model_path:
            if self.cfg.model_path:
                self.model_path = self.cfg.model_path
            else:
                from worker_svc.model.default import ensure_default_model
                self.model_path = str(ensure_default_model())
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = self.commands()
        for name in self.services if only is None else only:
            self.start_one(name, argv[name], timeout)
        return self

    def start_one(self, name: str, argv: list[str] | None = None, timeout: float | None = None) -> None:
        """Starts (or restarts) one service and waits until it is ready, at most ``timeout`` seconds (None: the
        config's ``start_timeout``); raises StartupInterrupted (the process left running, for stop()) when
        ``interrupt`` is set before or meanwhile."""
        timeout = self.cfg.start_timeout if timeout is None else timeout
        if self.interrupt.is_set():
            raise StartupInterrupted(f"interrupted before {name} started")
        argv = argv or self.commands()[name]
        ensure_free(self.cfg.bind_host, self.ports[name], name)
        env = service_env(os.environ, self.env)
        # Each service in its own session: a terminal's Ctrl-C (SIGINT to the foreground process group)
        # reaches only the launcher, which then stops the services in order (gateway first, so it drains).
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.ready(name):
            if self.interrupt.is_set():
                raise StartupInterrupted(f"interrupted while {name} was starting")
            code = self.procs[name].poll()
            if code is not None:
                raise StartupError(f"{name} exited with code {code} during start-up:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise StartupError(f"{name} not ready after {timeout:.0f} s:\n{self.log_tail(name)}")
            self.interrupt.wait(0.2)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Sends ``sig`` to one service (SIGKILL by default) and, for SIGKILL/SIGTERM, waits for it to exit."""
        proc = self.procs[name]
        proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc.wait(timeout=60)

    def stop(self, grace: float | None = None) -> dict[str, int]:
        """SIGTERM to every service in reverse start order, SIGKILL after ``grace`` s (default: the services'
        drain_seconds + 10 s, so a drain is never cut short); returns exit codes."""
        grace = self.cfg.drain_seconds + 10.0 if grace is None else grace
        codes: dict[str, int] = {}
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=grace)
            codes[name] = proc.returncode
        self.procs.clear()
        return codes

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main_pid_banner(stack: Stack) -> str:
    pids = ", ".join(f"{n}={p.pid}" for n, p in stack.procs.items())
    return f"codeserve is serving on {stack.url}  (processes: {pids}; logs in {stack.log_dir}; Ctrl-C stops)"


if __name__ == "__main__":  # pragma: no cover - use `python -m launcher`
    sys.exit("use: python -m launcher")
