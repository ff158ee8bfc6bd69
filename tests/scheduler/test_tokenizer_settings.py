"""The scheduler's tokenizer (text prompts sent straight over gRPC) ignores padding and truncation saved in
tokenizer.json: a prompt is its own ids, whole (truncation would cut it before the context check sees it)."""

from __future__ import annotations

import json
import pathlib

from scheduler_svc.detokenizer import load_tokenizer
from worker_svc.model.default import build_tokenizer_json


def test_saved_padding_and_truncation_do_not_change_a_prompts_ids(tmp_path: pathlib.Path) -> None:
    plain = json.loads(build_tokenizer_json())
    (tmp_path / "tokenizer.json").write_text(json.dumps(plain))
    text = "def add(a, b):\n    return a + b\n" * 4
    want = load_tokenizer(tmp_path).encode(text, add_special_tokens=False).ids
    saved = dict(plain, truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0},
                 padding={"strategy": {"Fixed": 200}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                          "pad_type_id": 0, "pad_token": "<|endoftext|>"})
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))
    assert load_tokenizer(tmp_path).encode(text, add_special_tokens=False).ids == want and len(want) > 8
