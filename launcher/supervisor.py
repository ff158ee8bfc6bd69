"""Restarts services of a running Stack that exit, like compose's ``restart: unless-stopped``."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from launcher.stack import Stack, StartupError


@dataclass
class Supervisor:
    """Watches ``stack``'s processes; a service that exited is started again (waited on until ready).

    More than ``max_restarts`` restarts of one service within ``window_s`` seconds raises RuntimeError
    naming it and its log tail: a service that cannot stay up is not retried forever. A service that exits during
    its restart counts as one more exit (restarted at the next check), not as a reason to stop the others.
    """

    stack: Stack
    max_restarts: int = 5
    window_s: float = 60.0
    restarts: dict[str, deque] = field(default_factory=dict)

    def check(self, stopping: threading.Event) -> list[str]:
        """Restarts every exited service (in start order); returns their names. Raises RuntimeError when one
        restarts too often, StartupError when a restarted service is still not ready after the start timeout."""
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
            try:
                self.stack.start_one(name)
            except StartupError as exc:
                if self.stack.procs[name].poll() is None:  # alive but not ready in time: give up
                    raise
                # it exited during its restart: one more exit, restarted at the next check (counted above)
                print(f"{name} exited during its restart ({exc.args[0].splitlines()[0]}); restarting it again",
                      file=sys.stderr, flush=True)
                continue
            print(f"{name} is back (pid {self.stack.procs[name].pid})", file=sys.stderr, flush=True)
            restarted.append(name)
        return restarted
