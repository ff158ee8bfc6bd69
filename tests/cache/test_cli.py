"""python -m cache_svc as a process: serving log line with the port, health SERVING, SIGTERM exits 0."""

from __future__ import annotations

import pytest

import json
import os
import pathlib
import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from codeserve.v1 import cache_pb2, cache_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_process_serves_and_drains_on_sigterm() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CODESERVE_SWITCH_INTERVAL_US"}  # the default is checked
    proc = subprocess.Popen([sys.executable, "-m", "cache_svc", "--listen", "127.0.0.1:0", "--lease-seconds", "5"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = json.loads(proc.stderr.readline())
        assert line["event"] == "serving" and line["service"] == "cache" and line["lease_seconds"] == 5
        assert line["switch_interval_s"] == pytest.approx(0.005)  # CPython's (common/switch_interval.py: unset)
        chan = grpc.insecure_channel(f"127.0.0.1:{line['port']}")
        health = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(service="codeserve.v1.Cache"),
                                                       timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = cache_pb2_grpc.CacheStub(chan)
        resp = stub.RegisterPool(cache_pb2.RegisterPoolRequest(op_id="1", pool_id="p", page_size=1, members=[
            cache_pb2.PoolMember(worker_id="w", epoch="e", capacity_tokens=10)]), timeout=10)
        assert resp.capacity == 10
        chan.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        events = [json.loads(x)["event"] for x in proc.stderr.read().splitlines() if x.startswith("{")]
        assert events[-2:] == ["stopping", "stopped"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_flags_exit_with_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "cache_svc", "--lease-seconds", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "--lease-seconds must be > 0" in proc.stderr
