"""Calling a dependency: retries on UNAVAILABLE with the same request (same op_id), typed errors otherwise."""

from __future__ import annotations

import time
from typing import Any, Callable

import grpc

from scheduler_svc.errors import DependencyError, DependencyUnavailable

from common.grpc_server import MAX_MESSAGE_BYTES

RETRY_CODES = (grpc.StatusCode.UNAVAILABLE,)
# Outages that are not retried: a deadline passed, or the service cancelled the call while stopping
# (the scheduler never cancels its own dependency calls). The call may have run, so the caller resyncs.
OUTAGE_CODES = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
BACKOFF_SECONDS = (0.05, 0.1, 0.2, 0.4, 0.8)


def dependency_channel(target: str) -> grpc.Channel:
    """A client channel to a dependency. Reconnect backoff is capped at 1 s (gRPC's default grows to
    120 s), so a restarted cache or worker is reached again within a second."""
    return grpc.insecure_channel(target, options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ])


def call(service: str, target: str, rpc_name: str, method: Callable[..., Any], request: Any,
         timeout: float, on_error: Callable[[grpc.RpcError], Exception | None] | None = None) -> Any:
    """Calls ``method(request, timeout=timeout)``; retries the SAME request on UNAVAILABLE (mutating RPCs
    carry an op_id, so the service answers a retry with its first receipt).

    Raises DependencyUnavailable after the retries (or at once on DEADLINE_EXCEEDED or CANCELLED);
    otherwise the exception
    ``on_error(err)`` returns, or DependencyError naming the service, RPC, code and details.
    """
    last = ""
    for attempt, pause in enumerate((*BACKOFF_SECONDS, None)):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as err:
            code = err.code()
            if code in RETRY_CODES and pause is not None:
                last = f"{code.name}: {err.details()}"
                time.sleep(pause)
                continue
            raise mapped_error(service, target, rpc_name, err, on_error, attempts=attempt + 1) from err
    raise DependencyUnavailable(service, target, last)  # pragma: no cover - the loop always returns or raises


def mapped_error(service: str, target: str, rpc_name: str, err: grpc.RpcError,
                 on_error: Callable[[grpc.RpcError], Exception | None] | None = None, attempts: int = 1) -> Exception:
    """The typed exception for a failed call (``call``'s mapping, after its retries or for a call sent once, such
    as a ``.future()``): DependencyUnavailable for UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED; else what
    ``on_error(err)`` returns, or DependencyError naming the service, RPC, code and details."""
    code = err.code()
    if code in RETRY_CODES or code in OUTAGE_CODES:
        return DependencyUnavailable(service, target, f"{rpc_name}: {code.name}: {err.details()} after {attempts} attempts")
    mapped = on_error(err) if on_error else None
    return mapped if mapped is not None else DependencyError(service, rpc_name, code, err.details() or "")
