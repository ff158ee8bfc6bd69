"""Several gateway processes on one listening socket (``python -m gateway --workers N``).

One gateway is one Python process: at a c64 wave boundary its event loop takes 64 stream ends and 64 new bodies one
after the other (run 23's hop trace: client_sent -> http_in p50 30 ms there, bench/README.md), and the next wave's
last arrival is on the phase's critical path. With ``--workers N`` the parent binds the socket, then forks N
children before anything else is built (no gRPC channel, no thread exists yet: both must be created after a fork);
each child builds its own app, its own gRPC channels to the scheduler, and serves the inherited socket, the kernel
handing each new connection to one of them (as gunicorn's and uvicorn's workers do).

The parent only supervises: on SIGTERM / SIGINT it sends SIGTERM (and SIGCONT) to every child, each drains as a
single gateway does (``--drain-seconds``), and the parent exits 0 when all exited 0. A child that exits on its own (a
crash) is not replaced: the parent stops the others and exits 1, so whatever started the gateway (the launcher, an
orchestrator) sees it fail; a parent killed outright (SIGKILL) takes the children with it (``PR_SET_PDEATHSIG``: each
gets SIGTERM and drains), so none is left holding the port. ``codeserve:request_errors``, the one count the gateway
keeps itself, is kept in prometheus-client's multiprocess mode (a directory of the children's value files,
``PROMETHEUS_MULTIPROC_DIR``), so a scrape answered by any child reports the sum over all of them; everything else on
/metrics is the scheduler's, read at the scrape.
One replica only (a usage error otherwise): the routing metrics of several are kept per process, and each child
would route on its own view of the replicas.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import traceback
from typing import Callable

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def run_workers(n: int, serve: Callable[[], None], sock: socket.socket, log) -> int:
    """Forks ``n`` (>= 2) children that each call ``serve()`` (which serves ``sock``, the listening socket, and
    returns when that child's server stopped) and supervises them until all exited; returns the exit status for the
    parent: 0 when every child exited 0 after a SIGTERM / SIGINT to the parent, 1 otherwise. The parent closes its
    copy of ``sock`` once the children have theirs (while they drain, a new connection is refused, not left in a
    backlog nobody accepts). Must be called before any thread or gRPC channel exists in this process. ``log``: a
    structlog logger. Raises ValueError for n < 2."""
    if n < 2:
        raise ValueError(f"run_workers needs at least 2 workers (got {n})")
    if "grpc" in sys.modules or "prometheus_client" in sys.modules:  # a channel must not cross a fork; the metrics'
        raise RuntimeError("run_workers must fork before grpc or prometheus_client is imported")  # mode is set at import
    metrics_dir = tempfile.mkdtemp(prefix="codeserve-gateway-metrics-")
    os.environ[MULTIPROC_ENV] = metrics_dir  # read by prometheus-client when the children import it
    stopping = False
    children: dict[int, int] = {}  # pid -> worker index

    def stop_all() -> None:
        # SIGTERM whatever the parent got: a child may have inherited SIGINT ignored (a `cmd &` of a script), and a
        # terminal's Ctrl-C reaches the children too, where a second SIGINT would make uvicorn skip the drain;
        # SIGCONT so that a stopped child can act on it
        nonlocal stopping
        stopping = True
        for pid in children:
            _signal(pid, signal.SIGTERM)
            _signal(pid, signal.SIGCONT)

    sigs = {signal.SIGTERM, signal.SIGINT}
    parent = os.getpid()
    old = {sig: signal.signal(sig, lambda *_: stop_all()) for sig in sigs}
    try:
        for i in range(n):
            # blocked across the fork: a signal in between reaches the parent's handler once the child is recorded,
            # and never a child before it has its own handlers back (it would forward to its siblings)
            signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
            pid = os.fork()
            if pid == 0:
                _child(old, sigs, parent, serve)  # never returns
            children[pid] = i
            signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)  # a pending SIGTERM runs stop_all() here
            if stopping:  # stopped while forking: no more children
                break
        sock.close()
        log.info("workers_started", workers=len(children), pids=sorted(children))
        failed = False
        while children:
            pid, status = os.waitpid(-1, 0)  # retried by Python after a signal handler ran (PEP 475)
            index = children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            # while stopping, a child the forwarded signal ended before its server had its handlers stopped cleanly
            if not stopping or code not in (0, -signal.SIGTERM, -signal.SIGINT):
                failed = True
                log.error("worker_exited", worker=index, pid=pid, exit_code=code, stopping=stopping)
                if not stopping:  # a crash: stop the others, fail as a whole
                    stop_all()
        return 1 if failed else 0
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _child(old: dict, sigs: set, parent: int, serve: Callable[[], None]) -> None:
    """A forked child's whole life: the handlers it had before the parent's (uvicorn's replace them), SIGTERM when the
    parent dies, then its server; it ends the process (``os._exit``) and never returns into the parent's code."""
    try:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        _stop_with(parent)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
        serve()
    except BaseException:  # not swallowed: unwinding on would run the parent's loop in this child, so the traceback
        traceback.print_exc()  # is printed and the process exits with a failure the parent reports
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stop_with(parent: int) -> None:
    """In a child: SIGTERM when the parent dies (a SIGKILLed parent must not leave children holding the port; each
    drains and exits), or exit at once if it already has. Raises OSError when prctl fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def _signal(pid: int, signum: int) -> None:
    """Sends ``signum`` to ``pid``; a child that already exited is no error."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
