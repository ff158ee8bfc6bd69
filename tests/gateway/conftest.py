"""Fixtures: a test tokenizer, the fake scheduler on a real gRPC port, and the gateway served by a
real uvicorn server on a free port."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import uvicorn

from gateway.__main__ import bind
from gateway.app import create_app
from gateway.scheduler_client import SchedulerClient
from gateway.settings import GatewaySettings, ModelFacts
from gateway.tokenizer import GatewayTokenizer
from tests.gateway.fake_scheduler import FakeScheduler, serve
from tests.gateway.tokenizer_fixture import build_tokenizer

N_POSITIONS = 256
MODEL_NAME = "test-model"


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory) -> GatewayTokenizer:
    path = build_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return GatewayTokenizer.from_file(path)


@pytest.fixture(scope="session")
def fake_server(tokenizer):
    fake = FakeScheduler(tokenizer, N_POSITIONS)
    running = serve(fake)
    yield fake, running
    running.server.stop(0)


@pytest.fixture
def fake(fake_server):
    fake, running = fake_server
    fake.reset()
    running.set_serving(True)
    yield fake
    running.set_serving(True)


class Gateway:
    """A uvicorn server running the gateway app in a background thread."""

    def __init__(self, app) -> None:
        self._sock = bind("127.0.0.1", 0)  # the gateway's own listening socket (TCP_NODELAY on accepted ones)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self._sock.close()


def make_settings(**overrides) -> GatewaySettings:
    base = GatewaySettings(model_name=MODEL_NAME, model=ModelFacts(n_positions=N_POSITIONS, vocab_size=400),
                           health_timeout_s=2.0)
    return dataclasses.replace(base, **overrides)


@pytest.fixture
def start_gateway(fake_server, tokenizer):
    """Starts a gateway with settings overrides (against the fake scheduler, or ``target``)."""
    started: list[Gateway] = []

    def _start(target: str | None = None, **overrides) -> Gateway:
        fake_target = f"127.0.0.1:{fake_server[1].port}"
        client = SchedulerClient(target or fake_target, retry_after_s=1, unary_timeout_s=2.0)
        gw = Gateway(create_app(client, tokenizer, make_settings(**overrides)))
        started.append(gw)
        return gw

    yield _start
    for gw in started:
        gw.stop()


@pytest.fixture(scope="session")
def shared_gateway(fake_server, tokenizer):
    client = SchedulerClient(f"127.0.0.1:{fake_server[1].port}", retry_after_s=1, unary_timeout_s=2.0)
    gw = Gateway(create_app(client, tokenizer, make_settings()))
    yield gw
    gw.stop()


@pytest.fixture
def gateway(shared_gateway, fake) -> Gateway:
    """The gateway with default settings (shared by tests; the fake is reset for each test)."""
    return shared_gateway


def wait_until(predicate, timeout: float = 5.0) -> bool:
    """Polls ``predicate`` until it is true (returns True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
