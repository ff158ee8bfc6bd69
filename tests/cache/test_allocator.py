"""PageAllocator unit tests: all-or-nothing, reserved page, double free, free groups with staging."""

from __future__ import annotations

import pytest

from cache_svc.allocator import PageAllocator
from cache_svc.errors import FailedPrecondition, InvalidArgument


def test_all_or_nothing_and_reserved_page_never_handed_out() -> None:
    alloc = PageAllocator(num_pages=4, page_size=1)
    assert alloc.allocate(5) is None and alloc.free_pages == 4     # nothing taken
    pages = alloc.allocate(4)
    assert sorted(pages) == [1, 2, 3, 4] and 0 not in pages and alloc.free_pages == 0
    assert alloc.allocate(1) is None
    with pytest.raises(InvalidArgument):
        alloc.free([0])


def test_double_free_and_out_of_range_change_nothing() -> None:
    alloc = PageAllocator(num_pages=3, page_size=2)
    pages = alloc.allocate(2)
    alloc.free([pages[0]])
    with pytest.raises(FailedPrecondition, match="double free"):
        alloc.free([pages[1], pages[0]])
    assert alloc.free_pages == 2                                   # pages[1] was not freed either
    with pytest.raises(FailedPrecondition):
        alloc.free([pages[1], pages[1]])
    with pytest.raises(InvalidArgument):
        alloc.free([4])
    assert alloc.free_pages == 2
