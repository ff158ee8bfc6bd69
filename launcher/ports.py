"""The ports of a deployment (``service_ports``: derived here only) and the checks before boot: say which process
holds a port instead of timing out anonymously."""

from __future__ import annotations

import pathlib
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.config import StackConfig


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that were free on ``host`` a moment ago: all bound at once, then let go (ports
    picked one by one, each released before the next is asked for, can repeat: a stack's worker then held the
    port chosen for its scheduler, CI of 2026-12-02)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def holders(port: int) -> list[int]:
    """PIDs of processes with a listening TCP socket on ``port`` (Linux /proc; empty when unknown)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = pathlib.Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    pids: list[int] = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except (PermissionError, FileNotFoundError):
            continue  # a process we may not inspect, or one that just exited: it holds nothing we can name
        for fd in fds:
            try:
                target = fd.readlink().as_posix()
            except (OSError, FileNotFoundError):
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                pids.append(int(proc.name))
                break
    return sorted(pids)


def ensure_free(host: str, port: int, what: str) -> None:
    """Raises RuntimeError naming the holder's PIDs when ``host:port`` cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            pids = holders(port)
            who = f"held by PID(s) {', '.join(map(str, pids))}" if pids else "held by an unknown process"
            raise RuntimeError(f"{what} port {host}:{port} is in use ({who}): {exc.strerror}") from exc


# Replica i's worker and scheduler listen on the first replica's ports + REPLICA_STRIDE * i (by default
# 50052/50053, 50054/50055, ...); the cache and the gateway are one each.
REPLICA_STRIDE = 2


def service_ports(cfg: "StackConfig") -> dict[str, int]:
    """The TCP port of each service process of ``cfg``, by process name, in start order: cache, then each
    replica's worker and scheduler (``launcher.replicas.layout``), then the gateway. A port of 0 stays 0 (the
    stack picks a free one for each such service at start). Raises ValueError when ``cfg.replicas`` < 1."""
    from launcher.replicas import layout

    ports = {"cache": cfg.cache_port}
    for r in layout(cfg.replicas):
        ports[r.worker] = cfg.worker_port and cfg.worker_port + REPLICA_STRIDE * r.index
        ports[r.scheduler] = cfg.scheduler_port and cfg.scheduler_port + REPLICA_STRIDE * r.index
    ports["gateway"] = cfg.http_port
    return ports
