"""bench/stream_wave_bench.py runs both arms end to end (real servers, a client process): every stream of every
round is read, the JSON holds each arm's rounds and the medians it prints. No timing is asserted (speed is the
benchmark's business); only that the figures exist and are sane."""

from __future__ import annotations

import json

from bench import stream_wave_bench


def test_both_arms_deliver_every_message_and_the_json_holds_them(tmp_path, capsys):
    out = tmp_path / "wave.json"
    assert stream_wave_bench.main(["--streams", "6", "--rounds", "3", "--busy-ms", "2", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    for arm in ("threads", "aio"):
        rounds = result[arm]
        assert len(rounds) == 2 * (3 - 1)  # each arm twice, the first round of each left out
        for r in rounds:
            assert 0 <= r["first_ms"] <= r["p50_ms"] <= r["last_ms"]
        assert result["last_ms_median"][arm] > 0
    assert "last arrival, median over rounds" in capsys.readouterr().out
