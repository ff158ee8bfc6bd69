"""Page allocator of one KV pool: all-or-nothing allocation, frees, free groups with visible staging.

Slots are grouped in pages of ``page_size`` tokens; slot id = page * page_size + offset. Page 0 (slots
``0 .. page_size-1``) is reserved for padding and health probes and is never handed out, so usable slot
ids are ``page_size .. page_size * (num_pages + 1) - 1``. With page_size 1 a page is a slot.
"""

from __future__ import annotations

from cache_svc.errors import FailedPrecondition, InvalidArgument

RESERVED_PAGE = 0


class PageAllocator:
    """Free pages, staged pages, and the free group state. Knows nothing about owners.

    ``num_pages``: usable pages (the reserved page excluded), >= 0. ``page_size`` >= 1 tokens.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        if page_size < 1:
            raise InvalidArgument(f"page_size must be >= 1, got {page_size}")
        if num_pages < 0:
            raise InvalidArgument(f"num_pages must be >= 0, got {num_pages}")
        self.num_pages = num_pages
        self.page_size = page_size
        # Lowest pages are handed out first; freed pages are reused last-in first-out.
        self._free: list[int] = list(range(num_pages, 0, -1))
        self._free_set: set[int] = set(self._free)
        self._staged: list[int] = []
        self._group_open = False

    # ---- sizes (pages) -------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        """Pages allocatable now."""
        return len(self._free)

    @property
    def staged_pages(self) -> int:
        """Pages freed inside the open free group, allocatable once applied."""
        return len(self._staged)

    @property
    def group_open(self) -> bool:
        return self._group_open

    def free_page_ids(self) -> frozenset[int]:
        return frozenset(self._free_set)

    def staged_page_ids(self) -> frozenset[int]:
        return frozenset(self._staged)

    # ---- allocation ----------------------------------------------------------------------------
    def allocate(self, n_pages: int) -> list[int] | None:
        """Takes ``n_pages`` pages, all or nothing. Returns the page ids, or None (nothing taken) when
        fewer than ``n_pages`` are free. Does not touch staged pages (the caller's relief ladder does)."""
        if n_pages < 0:
            raise InvalidArgument(f"cannot allocate {n_pages} pages")
        if n_pages == 0:
            return []
        if n_pages > len(self._free):
            return None
        pages = self._free[-n_pages:]
        del self._free[-n_pages:]
        pages.reverse()
        self._free_set.difference_update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        """Returns pages: to the free list, or to the staging list while a free group is open.

        Raises InvalidArgument for the reserved page or an id out of range, FailedPrecondition for a
        page that is already free or staged (double free); on error nothing changes.
        """
        if not pages:
            return
        batch = set(pages)
        if min(batch) < 1 or max(batch) > self.num_pages:
            bad = next(p for p in pages if not 0 < p <= self.num_pages)
            raise InvalidArgument(f"page {bad} is reserved or out of range 1..{self.num_pages}")
        if len(batch) != len(pages) or not batch.isdisjoint(self._free_set) or not batch.isdisjoint(self._staged):
            seen: set[int] = set()
            staged = set(self._staged)
            for page in pages:
                if page in self._free_set or page in seen or page in staged:
                    raise FailedPrecondition(f"double free of page {page}")
                seen.add(page)
        if self._group_open:
            self._staged.extend(pages)
        else:
            self._free.extend(pages)
            self._free_set.update(batch)

    # ---- free groups ---------------------------------------------------------------------------
    def begin_free_group(self) -> None:
        """Opens a free group: later frees are staged. Raises FailedPrecondition when one is open."""
        if self._group_open:
            raise FailedPrecondition("a free group is already open")
        self._group_open = True

    def end_free_group(self) -> int:
        """Closes the group and applies its staged pages; returns how many were applied.
        Raises FailedPrecondition when no group is open."""
        if not self._group_open:
            raise FailedPrecondition("no free group is open")
        applied = self.apply_staged()
        self._group_open = False
        return applied

    def apply_staged(self) -> int:
        """Makes staged pages allocatable without closing the group; returns how many were applied."""
        applied = len(self._staged)
        self._free.extend(self._staged)
        self._free_set.update(self._staged)
        self._staged.clear()
        return applied

    def clone(self) -> "PageAllocator":
        """An independent copy (for what-if checks such as the integrity check's trial eviction)."""
        other = PageAllocator.__new__(PageAllocator)
        other.num_pages = self.num_pages
        other.page_size = self.page_size
        other._free = list(self._free)
        other._free_set = set(self._free_set)
        other._staged = list(self._staged)
        other._group_open = self._group_open
        return other
