"""Greedy outputs through HTTP equal HF token for token for real code prompts (Python, JavaScript, SQL,
Go, fill-in-the-middle), solo and all at once."""

from __future__ import annotations

import concurrent.futures

import pytest

from tests.scheduler import hf

PROMPTS = [
    'def binary_search(arr, target):\n    """Return the index of target in sorted arr, or -1."""\n',
    "import os\nimport sys\n\n\ndef main(argv):\n    path = os.path.join(",
    "class LRUCache:\n    def __init__(self, capacity: int):\n        self.capacity = capacity\n",
    "function debounce(fn, wait) {\n  // Delay calls to fn until wait ms have passed\n  let timer;\n",
    "const express = require('express');\nconst app = express();\n\napp.get('/', (req, res) => {\n",
    "SELECT u.id, u.name, COUNT(o.id) AS orders\nFROM users u\nLEFT JOIN orders o ON o.user_id = u.id\n",
    "-- Top five customers by revenue in 2023\nSELECT customer_id, SUM(amount)\n",
    "// Reverse returns its argument string reversed rune-wise.\nfunc Reverse(s string) string {\n",
    "package main\n\nimport \"fmt\"\n\n// Sum adds all numbers in xs.\nfunc Sum(xs []int) int {\n",
    "<fim_prefix>def quick_sort(arr):\n    if len(arr) <= 1:\n        return arr\n    <fim_suffix>\n"
    "    return quick_sort(left) + mid + quick_sort(right)\n<fim_middle>",
    "#!/usr/bin/env bash\n# Back up the home directory\nset -euo pipefail\n",
]


def generate_ids(http, prompt: str, max_new_tokens: int = 24) -> list[int]:
    reply = http.post("/generate", json={"text": prompt, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0}})
    assert reply.status_code == 200, reply.text
    return reply.json()["output_ids"]


@pytest.fixture(scope="module")
def expected(model_path, tokenizer) -> list[list[int]]:
    return [hf.greedy(model_path, tokenizer(p)["input_ids"], 24)[0] for p in PROMPTS]


def test_each_prompt_equals_hf(http, expected) -> None:
    assert len(PROMPTS) >= 10
    for prompt, want in zip(PROMPTS, expected):
        assert generate_ids(http, prompt) == want, prompt


def test_all_at_once_equal_hf(http, expected) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: generate_ids(http, p), PROMPTS))
    assert got == expected
