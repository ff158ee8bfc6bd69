"""Processes that share stderr (a gateway of --workers) never interleave two JSON log lines into one: each line is
one write() (common/logs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tools.gen_protos import ROOT

WRITER = ("from common.logs import configure\n"
          "log = configure('w')\n"
          "for i in range(3000): log.info('line', i=i, pad='x' * 200)\n")


def test_two_processes_logging_to_one_file_give_whole_json_lines(tmp_path):
    path = tmp_path / "shared.log"
    with open(path, "w") as out:
        procs = [subprocess.Popen([sys.executable, "-c", WRITER], cwd=ROOT, stderr=out,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)})
                 for _ in range(2)]
        assert [p.wait(120) for p in procs] == [0, 0]
    lines = path.read_text().splitlines()
    assert len(lines) == 6000
    assert sorted(json.loads(line)["i"] for line in lines) == sorted(list(range(3000)) * 2)
