"""Restarts services of a running Stack that exit, like compose's ``restart: unless-stopped``."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from launcher.stack import Stack


@dataclass
class Supervisor:
    """Watches ``stack``'s processes; a service that exited is started again (waited on until ready).

    More than ``max_restarts`` restarts of one service within ``window_s`` seconds raises RuntimeError
    naming it and its log tail: a service that cannot stay up is not retried forever.
    """

    stack: Stack
    max_restarts: int = 5
    window_s: float = 60.0
    restarts: dict[str, deque] = field(default_factory=dict)

    def check(self, stopping: threading.Event) -> list[str]:
        """Restarts every exited service (in start order); returns their names. Raises RuntimeError when one
        restarts too often, StartupError when a restart fails."""
        restarted = []
        for name, proc in list(self.stack.procs.items()):
            if stopping.is_set() or proc.poll() is None:
                continue
            now = time.monotonic()
            recent = self.restarts.setdefault(name, deque())
            while recent and now - recent[0] > self.window_s:
                recent.popleft()
            if len(recent) >= self.max_restarts:
                raise RuntimeError(f"{name} exited {len(recent) + 1} times within {self.window_s:.0f} s "
                                   f"(last code {proc.returncode}):\n{self.stack.log_tail(name)}")
            recent.append(now)
            print(f"{name} exited with code {proc.returncode}; restarting it (logs: {self.stack.log_dir}/{name}.log)",
                  file=sys.stderr, flush=True)
            self.stack.start_one(name)
            print(f"{name} is back (pid {self.stack.procs[name].pid})", file=sys.stderr, flush=True)
            restarted.append(name)
        return restarted
