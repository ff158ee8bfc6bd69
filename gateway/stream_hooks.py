"""The interface between one Generate call (gateway.generation.GenerationStream) and the router that placed it
(gateway.dispatch): the call reports its start, its failures and its end, and may be retried on another replica."""

from __future__ import annotations

from typing import Protocol

import grpc

from codeserve.v1 import scheduler_pb2
from gateway.errors import ApiError
from gateway.scheduler_client import SchedulerClient


class StreamHooks(Protocol):
    """What a routed call tells its router (gateway.dispatch): ``first_message`` (the request started: its prefill
    is written), ``failed`` (a gRPC error; ``before_first``: no message was read yet) returning the client to retry
    the call on, or None to fail it, and ``ended`` (the call is cancelled or done)."""

    def first_message(self, msg: scheduler_pb2.GenerateResponse) -> None: ...

    def failed(self, code: grpc.StatusCode, error: ApiError, before_first: bool) -> SchedulerClient | None: ...

    def ended(self) -> None: ...
