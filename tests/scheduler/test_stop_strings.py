"""Stop strings are held back: no fragment of a matched stop string is ever released (case A4)."""

import pytest
from hypothesis import given, strategies as st

from scheduler_svc.stop_strings import StopStringMatcher


def run(stops, chunks, keep=False):
    m = StopStringMatcher(stops, no_stop_trim=keep)
    out = []
    for chunk in chunks:
        res = m.push(chunk)
        out.append(res.text)
        if res.matched is not None:
            return out, res.matched
    out.append(m.flush())
    return out, None


def test_a4_alphabet_never_streams_a_fragment():
    out, matched = run(["DEFGHIJ"], ["D", "EF", "GHI", "J", "KLM"])
    assert matched == "DEFGHIJ"
    assert out == ["", "", "", ""]


def test_a4_false_start_is_released_when_it_cannot_match_anymore():
    out, matched = run(["\ndef "], ["    return x\n", "de", "lta = 1\n", "def ", "g():"])
    assert matched == "\ndef "
    assert out == ["    return x", "", "\ndelta = 1", ""]
    assert "".join(out) == "    return x\ndelta = 1"


def test_a4_stop_at_the_very_start_gives_empty_text():
    out, matched = run(["\n"], ["\n    pass"])
    assert (out, matched) == ([""], "\n")


def test_no_stop_trim_keeps_the_stop_string():
    out, matched = run(["END"], ["abc E", "ND tail"], keep=True)
    assert "".join(out) == "abc END" and matched == "END"


def test_first_stop_to_complete_wins():
    assert run(["abcd", "bc"], ["abcd"]) == (["a"], "bc")
    assert run(["abcd", "bc"], ["a", "b", "c", "d"]) == (["", "", "a"], "bc")


def test_flush_releases_held_text_without_a_match():
    assert run(["xyz"], ["abc x", "y"]) == (["abc ", "", "xy"], None)


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher(["a", ""])


def oracle(text, stops):
    """Character by character: the first stop to complete ends the text."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            s = max(hits, key=len)
            return text[: end - len(s)], s
    return text, None


@given(text=st.text(alphabet="ab\n", max_size=30),
       stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), min_size=1, max_size=3),
       cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=8))
def test_any_chunking_releases_exactly_the_text_before_the_first_stop(text, stops, cuts):
    points = sorted({c for c in cuts if c <= len(text)} | {0, len(text)})
    chunks = [text[a:b] for a, b in zip(points, points[1:])]
    out, matched = run(stops, chunks)
    expected, expected_stop = oracle(text, stops)
    assert "".join(out) == expected
    # Released text is always a prefix of the final answer: nothing was ever taken back.
    released = ""
    for piece in out:
        released += piece
        assert expected.startswith(released)
    if expected_stop is not None:
        assert matched is not None and text.find(matched) >= 0
