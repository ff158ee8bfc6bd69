"""Per-request hop timestamps for a latency breakdown across the services (opt-in, off by default).

With ``CODESERVE_HOP_TRACE=DIR`` in a service's environment, ``configure(service)`` opens
``DIR/<service>.<pid>.tsv`` and every ``mark(request_id, hop)`` appends ``request_id \\t hop \\t t`` to it, ``t``
being ``time.monotonic_ns()`` (CLOCK_MONOTONIC on Linux: one clock for every process of a machine, so marks of
different services compare). The request id is the gateway's (``GenerateRequest.request_id``: ``cmpl-...-0``),
so one request's marks join across the gateway, the scheduler and the worker. ``bench/hop_report.py`` turns a
directory of them into the time between consecutive hops (p50, mean); ``bench/editor_bench.py --hop-trace DIR``
runs the editor workload with it. Without the variable ``mark`` returns at once (one attribute test).

Hops marked (the first time each happens for a request, in the order a request meets them):
gateway ``http_in`` (the middleware read the body), ``call`` (the Generate call is started),
``first_message`` (its first message arrived), ``first_chunk`` (the first event is handed to the HTTP server);
scheduler ``generate`` (the servicer took the call), ``taken`` (the loop took it), ``match_sent`` / ``match_back``
(its admission Match was sent / its reply read by the loop; an early Match, ``scheduler_svc/early_match.py``, is
sent by the servicer thread, around ``taken``; cache ``cache_in``, ``match_in`` / ``match_out`` between them: the call
carrying it arrived (a Batch: before the operations deferred ahead of it), the servicer took it / built its
reply), ``admitted`` (it was admitted), ``extend_sent`` (its first extend Forward was sent), ``extend_reply`` (that
Forward's reply is being applied), ``first_token`` (its first token is on its stream), ``first_yield`` (the
servicer hands the first message to gRPC); worker ``forward_in`` / ``forward_run`` / ``forward_out`` (the Forward carrying its
first chunk arrived at the servicer / its turn came after the Forwards ahead of it / its reply is returned).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

ENV = "CODESERVE_HOP_TRACE"

_out: TextIO | None = None
_seen: set[tuple[str, str]] = set()  # (request id, hop) marked already: the first time counts
_lock = threading.Lock()  # marks come from several threads of a service


def configure(service: str, directory: str | None = None) -> str | None:
    """Starts tracing this process as ``service`` into ``directory`` (default: the ``CODESERVE_HOP_TRACE``
    variable; neither: tracing stays off). Returns the file's path, or None when off. Raises OSError when the
    directory cannot be written."""
    global _out
    directory = directory if directory is not None else os.environ.get(ENV) or None
    if directory is None:
        return None
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{service}.{os.getpid()}.tsv")
    _out = open(path, "a", buffering=1, encoding="utf-8")  # a line per write: marks survive a killed process
    return path


def enabled() -> bool:
    """True when this process traces."""
    return _out is not None


def mark(request_id: str, hop: str, t_ns: int | None = None) -> None:
    """Records that ``request_id`` reached ``hop`` now (or at ``t_ns``, a ``time.monotonic_ns()`` taken
    earlier); a hop already marked for that request is not marked again. No-op when tracing is off or the id is
    empty."""
    if _out is None or not request_id:  # a call without an id joins nothing
        return
    t = time.monotonic_ns() if t_ns is None else t_ns
    key = (request_id, hop)
    with _lock:
        if key in _seen:
            return
        if len(_seen) > 200_000:  # a long run: forget the keys written so far (~30 MB; later hops are new ones)
            _seen.clear()
        _seen.add(key)
        _out.write(f"{request_id}\t{hop}\t{t}\n")
