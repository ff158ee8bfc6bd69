"""The replicas of a local deployment: each one worker and its scheduler with their own KV pool, all pools held
by the one cache service, one gateway routing over them. Names and devices are derived here only (ports:
``launcher.ports.service_ports``).

One replica (the default) keeps the names of a stack without replicas: services ``worker`` and ``scheduler``,
pool ``default``, worker id ``worker-0``, owner ``scheduler-0``. With N > 1, replica i is services ``worker-i`` and
``scheduler-i``, pool ``pool-i``, worker id ``worker-i``, owner ``scheduler-i`` (distinct owners: the cache replaces
an older session of the same owner, so two schedulers may not share one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.config import StackConfig


@dataclass(frozen=True)
class Replica:
    """One replica: the process names of its worker and scheduler and the ids they use (its device: ``devices``)."""

    index: int
    worker: str       # service (process, log file) name
    scheduler: str
    worker_id: str    # the worker's --worker-id
    owner: str        # the scheduler's session owner at the cache (--owner)
    pool_id: str      # the scheduler's --pool-id at the cache


def cuda_device_count() -> int:
    """CUDA devices torch sees (0 without CUDA). Imports torch: called only to pick devices for replicas > 1."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def devices(cfg: "StackConfig") -> list[str]:
    """The worker device of each replica, in replica order.

    ``cfg.devices`` (comma-separated, e.g. ``cuda:0,cuda:1``; a device may repeat: replicas sharing one GPU) is
    taken as given. Otherwise one replica gets ``cfg.device`` unchanged; N > 1 replicas get, for ``cfg.device``:
    ``cpu`` the CPU each, ``cuda`` ``cuda:0..N-1``, ``cuda:K`` all ``cuda:K`` (sharing it), ``auto`` ``cuda:0..N-1``
    when CUDA is present, else the CPU each.

    Raises ValueError when ``cfg.devices`` does not name ``cfg.replicas`` devices or names one that is not cpu,
    cuda or cuda:N, and when ``auto`` finds fewer CUDA devices than replicas (but at least one).
    """
    n = cfg.replicas
    if cfg.devices is not None:
        given = [d.strip() for d in cfg.devices.split(",")]
        if len(given) != n:
            raise ValueError(f"--devices names {len(given)} device(s) ({cfg.devices!r}) for --replicas {n}: "
                             f"give one per replica")
        for d in given:
            if not re.fullmatch(r"cpu|cuda(:\d+)?", d):
                raise ValueError(f"--devices: {d!r} is not cpu, cuda or cuda:N")
        return given
    if n == 1:
        return [cfg.device]
    if cfg.device == "cpu" or re.fullmatch(r"cuda:\d+", cfg.device):
        return [cfg.device] * n
    if cfg.device == "cuda":
        return [f"cuda:{i}" for i in range(n)]
    count = cuda_device_count()
    if count == 0:
        return ["cpu"] * n
    if count < n:
        raise ValueError(f"--replicas {n} with --device auto: only {count} CUDA device(s); give --devices "
                         f"(replicas may share one: --devices {','.join(['cuda:0'] * n)}) or --device cpu")
    return [f"cuda:{i}" for i in range(n)]


def missing_cuda(devs: list[str], count: int) -> str | None:
    """Why ``devs`` (the replicas' worker devices) cannot run on a machine with ``count`` CUDA devices, or None when
    they can: a ``cuda`` device with none present, or ``cuda:K`` with K >= count. The launcher refuses such a layout
    before it starts anything (each worker would otherwise start and fail on its own)."""
    wanted = sorted({d for d in devs if d.startswith("cuda")})
    if not wanted:
        return None
    need = max(int(d.split(":")[1]) if ":" in d else 0 for d in wanted) + 1
    if count >= need:
        return None
    return (f"the workers' devices ({', '.join(wanted)}) need {need} CUDA device(s), but this machine has {count}: "
            f"give --device cpu (or --devices cpu,...) to run on the CPU")


def layout(n: int) -> list[Replica]:
    """The ``n`` replicas of a deployment, names as in the module docstring. Raises ValueError when ``n`` < 1."""
    if n < 1:
        raise ValueError(f"--replicas must be >= 1 (got {n})")
    if n == 1:
        return [Replica(0, "worker", "scheduler", "worker-0", "scheduler-0", "default")]
    return [Replica(i, f"worker-{i}", f"scheduler-{i}", f"worker-{i}", f"scheduler-{i}", f"pool-{i}") for i in range(n)]
