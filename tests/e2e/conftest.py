"""All four services as real processes (launcher.Stack via tests.stack.Backend) on free loopback ports,
CPU fp32, the embedded default model; HTTP through the real gateway."""

from __future__ import annotations

import httpx
import pytest

from tests.stack import Backend


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory):
    """Roomy pool, chunk size 64 so long prompts take the chunked-prefill path."""
    be = Backend.start(tmp_path_factory.mktemp("e2e-logs"), kv_tokens=32768, chunk_size=64, max_running_requests=32)
    try:
        be.stack.start_one("gateway")
    except BaseException:
        be.stop()
        raise
    yield be
    be.stop()


@pytest.fixture(scope="session")
def url(backend: Backend) -> str:
    return backend.stack.url


@pytest.fixture(scope="session")
def model_path(backend: Backend) -> str:
    return backend.stack.model_path


@pytest.fixture(scope="session")
def http(url: str):
    with httpx.Client(base_url=url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def model_name(http: httpx.Client) -> str:
    return http.get("/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="session")
def tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)
