"""A small byte-level BPE tokenizer.json with StarCoder's special tokens, built for gateway tests
(the gateway only needs a tokenizer; the real checkpoint's tokenizer has the same structure)."""

from __future__ import annotations

import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]

_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import os\nimport sys\n\ndef main():\n    args = sys.argv\n    path = os.getcwd()\n",
    "function add(a, b) {\n  return a + b;\n}\n",
    "SELECT name, count(*) FROM users WHERE id = 1 GROUP BY name;\n",
    "func main() {\n\tfmt.Println(\"hello\")\n}\n",
    "x = a ., b ! c ?\nrun(\"python3 ./src/main.py $IN $OUT\" , 'it' )\n",
    "# alphabet\nletters = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ'\n",
    "caf\u00e9 na\u00efve \u00fcber \u2603 \u4e2d\u6587 \U0001f600\n",
]


def build_tokenizer(path: pathlib.Path, special_tokens: list[str] | None = None) -> pathlib.Path:
    """Trains the tokenizer (deterministic, a few ms) and writes it to ``path`` (a tokenizer.json);
    ``special_tokens`` replaces SPECIAL_TOKENS (ids 0..)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special_tokens if special_tokens is not None else SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer.save(str(path))
    return path
