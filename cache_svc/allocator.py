"""Page allocator of one KV pool: all-or-nothing allocation and frees.

Slots are grouped in pages of ``page_size`` tokens; slot id = page * page_size + offset. Page 0 (slots
``0 .. page_size-1``) is reserved for padding and health probes and is never handed out, so usable slot
ids are ``page_size .. page_size * (num_pages + 1) - 1``. With page_size 1 a page is a slot.
"""

from __future__ import annotations

from cache_svc.errors import FailedPrecondition, InvalidArgument

RESERVED_PAGE = 0


class PageAllocator:
    """Free pages. Knows nothing about owners.

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

    # ---- sizes (pages) -------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        """Pages allocatable now."""
        return len(self._free)

    def free_page_ids(self) -> frozenset[int]:
        return frozenset(self._free_set)

    # ---- allocation ----------------------------------------------------------------------------
    def allocate(self, n_pages: int) -> list[int] | None:
        """Takes ``n_pages`` pages, all or nothing. Returns the page ids, or None (nothing taken) when
        fewer than ``n_pages`` are free (the caller's relief ladder evicts first)."""
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
        """Returns pages to the free list (allocatable at once).

        Raises InvalidArgument for the reserved page or an id out of range, FailedPrecondition for a
        page that is already free (double free); on error nothing changes.
        """
        if not pages:
            return
        batch = set(pages)
        if min(batch) < 1 or max(batch) > self.num_pages:
            bad = next(p for p in pages if not 0 < p <= self.num_pages)
            raise InvalidArgument(f"page {bad} is reserved or out of range 1..{self.num_pages}")
        if len(batch) != len(pages) or not batch.isdisjoint(self._free_set):
            seen: set[int] = set()
            for page in pages:
                if page in self._free_set or page in seen:
                    raise FailedPrecondition(f"double free of page {page}")
                seen.add(page)
        self._free.extend(pages)
        self._free_set.update(batch)

    def clone(self) -> "PageAllocator":
        """An independent copy (for what-if checks such as the integrity check's trial eviction)."""
        other = PageAllocator.__new__(PageAllocator)
        other.num_pages = self.num_pages
        other.page_size = self.page_size
        other._free = list(self._free)
        other._free_set = set(self._free_set)
        return other
