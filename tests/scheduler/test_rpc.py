"""scheduler_svc.rpc.call: which dependency failures are outages (resync and recompute) and which are errors."""

import grpc
import pytest

from scheduler_svc.errors import DependencyError, DependencyUnavailable
from scheduler_svc.rpc import call


class Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"{self._code.name} from the test"


def failing(code: grpc.StatusCode):
    calls = []

    def method(request, timeout):
        calls.append(request)
        raise Failed(code)

    return method, calls


def test_cancelled_by_a_stopping_server_is_an_outage_and_is_not_retried() -> None:
    # A worker that shuts down (SIGTERM/SIGINT) cancels the Forward in flight: the scheduler must resync
    # and recompute, not fail its loop with INTERNAL. Not retried: the call may have run.
    method, calls = failing(grpc.StatusCode.CANCELLED)
    with pytest.raises(DependencyUnavailable, match="CANCELLED"):
        call("worker", "127.0.0.1:1", "Forward", method, "req", timeout=1)
    assert calls == ["req"]


def test_unavailable_is_retried_with_the_same_request_then_an_outage() -> None:
    method, calls = failing(grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(DependencyUnavailable):
        call("cache", "127.0.0.1:1", "Allocate", method, "same-op", timeout=1)
    assert len(calls) > 1 and set(calls) == {"same-op"}


def test_invalid_argument_is_an_error_naming_service_and_rpc() -> None:
    method, _ = failing(grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(DependencyError, match=r"worker\.Forward failed: INVALID_ARGUMENT"):
        call("worker", "127.0.0.1:1", "Forward", method, "req", timeout=1)
