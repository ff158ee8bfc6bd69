"""The committed generated code in codeserve/v1 must equal what protoc makes from protos/ now."""

import pathlib

from tools.gen_protos import ROOT, generate


def test_generated_code_matches_protos(tmp_path: pathlib.Path) -> None:
    fresh = generate(tmp_path)
    assert fresh, "protoc generated nothing"
    for path in fresh:
        committed = ROOT / "codeserve" / "v1" / path.name
        assert committed.exists(), f"{committed} missing: run python -m tools.gen_protos"
        assert committed.read_text() == path.read_text(), (
            f"{committed.name} is stale: run python -m tools.gen_protos and commit the result"
        )


def test_every_rpc_has_a_comment() -> None:
    for proto in (ROOT / "protos").rglob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("rpc "):
                assert lines[i - 1].strip().startswith("//"), f"{proto.name}:{i + 1} rpc without a comment"
