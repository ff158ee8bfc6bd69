"""Compiles protos/codeserve/v1/*.proto into codeserve/v1/*_pb2*.py (committed; a test checks they match).

Usage: python -m tools.gen_protos [--out DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from grpc_tools import protoc
import grpc_tools

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "protos"


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Runs protoc on every .proto under protos/ and returns the generated files.

    Raises RuntimeError when protoc fails.
    """
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    rc = protoc.main(
        ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out_dir}",
         f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *protos]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    return sorted(p for p in (out_dir / "codeserve" / "v1").glob("*.py*") if "_pb2" in p.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT)
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)


if __name__ == "__main__":
    sys.exit(main())
