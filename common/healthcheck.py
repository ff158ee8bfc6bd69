"""Container health check: ``python -m common.healthcheck grpc HOST:PORT`` or ``... http URL``.

Exits 0 when the target is serving (gRPC health SERVING, or HTTP 200), 1 otherwise, printing why.
"""

from __future__ import annotations

import sys

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check_grpc(target: str, timeout: float) -> str | None:
    """None when ``target`` reports SERVING, else the reason."""
    with grpc.insecure_channel(target) as chan:
        try:
            reply = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            return f"{target}: {exc.code().name} {exc.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def check_http(url: str, timeout: float) -> str | None:
    """None when GET ``url`` answers 200, else the reason."""
    try:
        reply = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return f"{url}: {exc!r}"
    return None if reply.status_code == 200 else f"{url}: HTTP {reply.status_code} {reply.text[:200]}"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("grpc", "http"):
        print(__doc__, file=sys.stderr)
        return 2
    problem = (check_grpc if argv[0] == "grpc" else check_http)(argv[1], timeout=5.0)
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
