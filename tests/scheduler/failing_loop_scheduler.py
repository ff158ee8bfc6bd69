"""``python -m tests.scheduler.failing_loop_scheduler FLAGS``: the real scheduler process (``python -m scheduler_svc
FLAGS``) whose loop raises once a request with id ``FAULT_RID`` runs, as a bug in the loop would: the process takes
its ``loop_died`` path (streams end with INTERNAL, health NOT_SERVING, exit 1)."""

from __future__ import annotations

import sys

from scheduler_svc import scheduler
from scheduler_svc.__main__ import main

FAULT_RID = "loop-fault"


def _failing_step(step):
    def failing(self) -> bool:
        if any(req.rid == FAULT_RID for req in self.table.running):
            raise RuntimeError("injected loop fault")
        return step(self)
    return failing


if __name__ == "__main__":
    scheduler.Scheduler.step = _failing_step(scheduler.Scheduler.step)
    sys.exit(main(sys.argv[1:]))
