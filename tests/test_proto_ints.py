"""common/proto_ints.py: repeated integer fields as Python ints, through numpy for long ones."""

from __future__ import annotations

import pytest

from codeserve.v1 import cache_pb2, scheduler_pb2, worker_pb2
from common.proto_ints import LONG, as_list, as_tuple


@pytest.mark.parametrize("n", [0, 1, LONG, LONG + 1, 1750])
def test_values_and_types_equal_the_fields(n) -> None:
    ids = [(i * 7919) % 49152 for i in range(n)]
    for field in (cache_pb2.MatchItem(token_ids=ids).token_ids,          # uint32 / int32 / int64 fields alike
                  worker_pb2.ForwardItem(prefix_slot_ids=ids).prefix_slot_ids,
                  scheduler_pb2.TokenIds(ids=ids).ids):
        got = as_list(field)
        assert got == ids and type(got) is list and all(type(v) is int for v in got)
        assert as_tuple(field) == tuple(ids) and type(as_tuple(field)) is tuple


def test_large_values_keep_their_size() -> None:
    field = worker_pb2.ForwardItem(prefix_slot_ids=[2**31 - 1] * (LONG + 1)).prefix_slot_ids
    assert as_list(field) == [2**31 - 1] * (LONG + 1)
