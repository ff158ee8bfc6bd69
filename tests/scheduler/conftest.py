"""Fixtures: the real cache, worker and scheduler as subprocesses (tests/stack.py), the default model."""

import pytest

from tests.stack import Backend
from worker_svc.model.default import ensure_default_model


@pytest.fixture(scope="session")
def model_path() -> str:
    return str(ensure_default_model())


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from scheduler_svc.detokenizer import load_tokenizer

    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def backend(tmp_path_factory, model_path):
    """cache + worker + scheduler with an 8192-token pool and the default chunk size (512)."""
    with Backend.start(tmp_path_factory.mktemp("backend-logs"), model_path=model_path) as be:
        yield be
