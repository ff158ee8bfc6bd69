"""The gateway on the embedded default checkpoint's tokenizer (K2, K3), and ``python -m gateway`` as a
real process (flags, JSON "serving" log line, SIGTERM exit 0) in front of the fake scheduler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from gateway.tokenizer import GatewayTokenizer
from tests.gateway.test_logprobs_echo import K3_PROMPT
from tests.gateway.test_native import K2_PROMPT
from tools.gen_protos import ROOT
from worker_svc.model.default import ensure_default_model

FIM_MARKERS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")


@pytest.fixture(scope="module")
def model_dir():
    return ensure_default_model()


def test_k2_markers_are_single_ids_and_counts_equal_hf(model_dir):
    from transformers import AutoTokenizer

    tok = GatewayTokenizer.from_file(model_dir)
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    for marker in FIM_MARKERS:
        (token_id,) = tok.encode(marker)
        assert tok.is_special(token_id)
        assert hf.convert_tokens_to_ids(marker) == token_id
    ids = tok.encode(K2_PROMPT)
    assert ids == hf(K2_PROMPT)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True,
                                                                  clean_up_tokenization_spaces=False)
    assert "<fim_" not in tok.decode(ids, skip_special_tokens=True)


def test_k3_decode_keeps_code_whitespace_like_hf_without_cleanup(model_dir):
    from transformers import AutoTokenizer

    tok = GatewayTokenizer.from_file(model_dir)
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tok.encode(K3_PROMPT)
    assert tok.decode(ids) == K3_PROMPT
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert "".join(tok.pieces(ids).pieces) == K3_PROMPT


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gateway_process(model_dir, fake_server, fake, tmp_path):
    port = _free_port()
    log_path = tmp_path / "gateway.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
             "--scheduler", f"127.0.0.1:{fake_server[1].port}", "--model-path", str(model_dir),
             "--model-name", "codeserve-default", "--api-key", "k1"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        serving = [json.loads(line) for line in log_path.read_text().splitlines()
                   if line.startswith("{") and '"serving"' in line]
        assert serving and serving[0]["port"] == port and serving[0]["service"] == "gateway"
        headers = {"Authorization": "Bearer k1"}
        models = httpx.get(f"{url}/v1/models", headers=headers).json()
        assert models["data"][0]["id"] == "codeserve-default"
        assert models["data"][0]["max_model_len"] == 4096
        r = httpx.post(f"{url}/v1/completions", headers=headers,
                       json={"model": "codeserve-default", "prompt": K3_PROMPT, "echo": True, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"].startswith(K3_PROMPT)
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x"}).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log_path.read_text()
