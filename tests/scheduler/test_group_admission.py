"""GroupAdmission (scheduler_svc/group_admission.py): a group's calls after its first join it, each once; a call alone
never joins; a group whose calls never all come is forgotten after its time. And group_size's range at validation."""

from __future__ import annotations

import pytest

from scheduler_svc.group_admission import GroupAdmission


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_calls_after_a_groups_first_join_it_each_once():
    g = GroupAdmission(ttl_s=60.0, clock=Clock())
    assert not g.joins("a", 3)             # the first call: checked against the limits
    g.queued_first("a", 3)
    assert g.joins("a", 3) and g.joins("a", 3)
    assert not g.joins("a", 3)             # a fourth call with the same id: the group had three
    assert len(g) == 0


def test_a_call_alone_never_joins_and_leaves_nothing():
    g = GroupAdmission(clock=Clock())
    for gid, size in (("", 5), ("b", 1), ("b", 0), ("b", -3)):
        g.queued_first(gid, size)
        assert not g.joins(gid, size)
    assert len(g) == 0


def test_a_group_whose_calls_never_all_come_is_forgotten():
    clock = Clock()
    g = GroupAdmission(ttl_s=60.0, clock=clock)
    g.queued_first("left", 200)
    assert g.joins("left", 200)
    clock.t += 60.0
    assert not g.joins("left", 200) and len(g) == 0   # past its time: checked as a first call again
    g.queued_first("x", 4)
    clock.t += 61.0
    g.queued_first("y", 2)                            # a new group drops the expired ones
    assert len(g) == 1 and g.joins("y", 2)


def test_group_size_out_of_range_is_invalid_argument(model_path):
    from tokenizers import Tokenizer

    from codeserve.v1 import scheduler_pb2, worker_pb2
    from scheduler_svc.validate import MAX_GROUP_SIZE, InvalidRequest, build_request

    tok = Tokenizer.from_file(f"{model_path}/tokenizer.json")
    info = worker_pb2.WorkerInfo(vocab_size=1024, n_positions=4096, eos_token_id=0)
    ok = build_request(scheduler_pb2.GenerateRequest(input_ids={"ids": [5, 6]}, max_new_tokens=1,
                                                     group_id="g", group_size=MAX_GROUP_SIZE), tok, info, 4096)
    assert ok.prompt_ids == [5, 6] and not ok.over_limits
    for bad in (-1, MAX_GROUP_SIZE + 1):
        with pytest.raises(InvalidRequest, match=rf"group_size must be in \[0, {MAX_GROUP_SIZE}\], got {bad}"):
            build_request(scheduler_pb2.GenerateRequest(input_ids={"ids": [5, 6]}, max_new_tokens=1, group_size=bad),
                          tok, info, 4096)
