"""Security over real HTTP and real processes: the Bearer API key (from $CODESERVE_API_KEY, compared in constant
time), internal gRPC ports bound to loopback only, the request limits (body size, prompt tokens, n, stop
strings, logprobs), and a schemathesis run against the gateway's own OpenAPI schema that finds no 5xx."""

from __future__ import annotations

import inspect
import os
import pathlib

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.reliability.system import System

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def sys_(tmp_path_factory):
    os.environ["CODESERVE_API_KEY"] = KEY  # the gateway reads the key from the environment (no --api-key flag)
    try:
        s = System.start(tmp_path_factory.mktemp("logs"), kv_tokens=8192, max_running_requests=8)
    finally:
        del os.environ["CODESERVE_API_KEY"]
    s.http.headers.update(AUTH)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def api_schema(sys_):
    return schemathesis.openapi.from_url(f"{sys_.url}/openapi.json", headers=AUTH)


def test_api_key_is_required_except_on_probes_and_compared_in_constant_time(sys_, settled):
    settled(sys_)
    body = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
    assert httpx.post(f"{sys_.url}/v1/completions", json=body).status_code == 401
    assert httpx.post(f"{sys_.url}/v1/completions", json=body,
                      headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(f"{sys_.url}/v1/completions", json=body, headers={"Authorization": KEY}).status_code == 401
    assert httpx.post(f"{sys_.url}/v1/completions", json=body, headers=AUTH).status_code == 200
    for path in ("/health", "/ready", "/health_generate", "/metrics"):
        assert httpx.get(f"{sys_.url}{path}", timeout=20).status_code == 200, path
    from gateway import middleware
    assert "hmac.compare_digest" in inspect.getsource(middleware.LimitsAndAuth)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(ip, port) of the TCP sockets in LISTEN state owned by ``pid`` (from /proc/net/tcp{,6})."""
    inodes = set()
    for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # 0A = LISTEN
                ip_hex, port_hex = parts[1].split(":")
                if ip_hex.startswith("0000000000000000FFFF0000"):  # IPv4-mapped IPv6 (::ffff:a.b.c.d)
                    ip_hex = ip_hex[-8:]
                if len(ip_hex) == 8:
                    ip = ".".join(str(int(ip_hex[i:i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    ip = "::1" if ip_hex == "00000000000000000000000001000000" else ip_hex
                found.add((ip, int(port_hex, 16)))
    return found


def test_every_service_listens_on_loopback_only(sys_):
    for name in ("cache", "worker", "scheduler", "gateway"):
        addrs = listening_addresses(sys_.pid(name))
        assert addrs, name
        assert all(ip in ("127.0.0.1", "::1") for ip, _ in addrs), (name, addrs)


@pytest.mark.parametrize("body,status,words", [
    ({"prompt": [5] * 4200, "max_tokens": 1}, 400, ["4200", "4096"]),
    ({"prompt": [5, 6], "max_tokens": 1, "n": 17}, 400, ["n"]),
    ({"prompt": [5, 6], "max_tokens": 1, "stop": ["x"] * 17}, 400, ["stop"]),
    ({"prompt": [5, 6], "max_tokens": 1, "stop": ["x" * 1025]}, 400, ["1024"]),
    ({"prompt": [5, 6], "max_tokens": 1, "logprobs": 21}, 400, ["logprobs"]),
    ({"prompt": [5, 6], "max_tokens": -1}, 400, ["max_tokens"]),
    ({"prompt": [[5, 6]] * 257, "max_tokens": 1}, 400, ["256"]),
])
def test_limits_give_a_4xx_naming_the_limit_and_change_nothing(sys_, settled, body, status, words):
    settled(sys_)
    r = sys_.post("/v1/completions", body)
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert all(w in message for w in words), message
    assert sys_.post("/v1/completions", {"prompt": [5, 6], "max_tokens": 2}).status_code == 200


def test_body_over_the_limit_is_413(sys_, settled):
    settled(sys_)
    r = sys_.http.post("/v1/completions", content=b'{"prompt": "' + b"a" * (17 * 1024 * 1024) + b'"}',
                       headers={"content-type": "application/json"})
    assert r.status_code == 413


schema = schemathesis.pytest.from_fixture("api_schema")

CALLS = [0]
GENERATION_CAPS = {"max_tokens": 4, "max_new_tokens": 4, "max_completion_tokens": 4, "n": 2}


def clamp(value, top: bool = False):
    """Caps generation lengths and fan-out in a generated body (the fuzz looks for 5xx, not for long runs): chat
    without a length would run to the context limit, native without sampling_params to 128 tokens."""
    if isinstance(value, dict):
        if top and "messages" in value and not {"max_tokens", "max_completion_tokens"} & set(value):
            value["max_tokens"] = 4
        if top and ("text" in value or "input_ids" in value) and "sampling_params" not in value:
            value["sampling_params"] = {"max_new_tokens": 4}
        if isinstance(value.get("sampling_params"), dict) and "max_new_tokens" not in value["sampling_params"]:
            value["sampling_params"]["max_new_tokens"] = 4
        for key, cap in GENERATION_CAPS.items():
            if isinstance(value.get(key), int) and not isinstance(value.get(key), bool) and value[key] > cap:
                value[key] = cap
        for v in value.values():
            clamp(v)
    elif isinstance(value, list):
        for v in value[:64]:
            clamp(v)
    return value


@schema.parametrize()
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_schemathesis_finds_no_server_error(case, sys_):
    if isinstance(case.body, (dict, list)):
        clamp(case.body, top=True)
    case.call_and_validate(base_url=sys_.url, headers=AUTH, checks=[not_a_server_error], timeout=60)
    CALLS[0] += 1


def test_schemathesis_sent_enough_requests(sys_, settled):
    """The fuzz above really ran (its cases are counted as they are sent), and left the pool clean."""
    settled(sys_)
    assert CALLS[0] >= 200, CALLS
