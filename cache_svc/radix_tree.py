"""Radix prefix tree of one KV pool (SGLang RadixCache semantics), page-granular, with namespaces.

Keys are token ids, values are the KV slot ids holding those tokens. With page_size P > 1 every node's key
length is a multiple of P and matching compares whole pages. Nodes under different namespaces never share
a prefix: the root's children are keyed by (namespace, first page).

Contract:
- ``match`` returns the longest cached prefix in whole pages; it may split a node (sizes unchanged) and it
  updates access times. It does not lock.
- ``peek`` returns the length ``match`` would find and changes nothing (no split, no access time, no tick):
  what a routing probe reads.
- ``insert`` returns the length already cached and the node ending the key; only the uncached part is stored.
- ``lock``/``unlock`` walk from a node to the root; ``lock_ref(parent) >= lock_ref(child)`` always holds;
  a split copies the lock ref to the new upper node.
- ``evict`` removes least recently used unlocked leaves (a parent that becomes an unlocked leaf is pushed
  too), so it may release more than asked; asking for more than is evictable releases what exists.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable, Iterator, Sequence

from cache_svc.errors import FailedPrecondition, InvalidArgument

_BLOCK = 64  # tokens ``_match_len`` compares at once


class TreeNode:
    """One node: ``key`` (token ids) and ``value`` (slot ids) of equal length, children, lock ref."""

    __slots__ = ("id", "namespace", "key", "value", "children", "parent", "lock_ref", "last_access")

    def __init__(self, node_id: int, namespace: str, key: list[int], value: list[int], parent: "TreeNode | None") -> None:
        self.id = node_id
        self.namespace = namespace
        self.key = key
        self.value = value
        self.children: dict[tuple, TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, ns={self.namespace!r}, key={self.key}, lock_ref={self.lock_ref})"


class RadixTree:
    """The tree. Sizes are tokens. ``evictable_size`` + ``protected_size`` == tokens held by the tree."""

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise InvalidArgument(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._ids = itertools.count(1)
        self.root = TreeNode(0, "", [], [], None)
        self.evictable_size = 0
        self.protected_size = 0
        self._tick = 0

    # ---- helpers -------------------------------------------------------------------------------
    def _child_key(self, node: TreeNode, namespace: str, key: Sequence[int]) -> tuple:
        first = tuple(key[: self.page_size])
        return (namespace, first) if node is self.root else first

    def _match_len(self, a: Sequence[int], b: Sequence[int]) -> int:
        """Length of the common prefix of lists ``a`` and ``b`` in whole pages: blocks of ``_BLOCK`` compared as
        slices, then the first differing block token by token."""
        end = min(len(a), len(b))
        n = 0
        while n + _BLOCK <= end and a[n : n + _BLOCK] == b[n : n + _BLOCK]:
            n += _BLOCK
        while n < end and a[n] == b[n]:
            n += 1
        return n - n % self.page_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Splits ``child`` after ``n`` tokens; returns the new upper node (same lock ref and access time)."""
        parent = child.parent
        assert parent is not None
        upper = TreeNode(next(self._ids), child.namespace, child.key[:n], child.value[:n], parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        parent.children[self._child_key(parent, child.namespace, child.key)] = upper
        child.key = child.key[n:]
        child.value = child.value[n:]
        child.parent = upper
        upper.children[self._child_key(upper, child.namespace, child.key)] = child
        return upper

    def _check_key(self, key: Sequence[int]) -> None:
        if len(key) % self.page_size:
            raise InvalidArgument(f"key length {len(key)} is not a multiple of page_size {self.page_size}")

    # ---- match / insert ------------------------------------------------------------------------
    def match(self, namespace: str, key: Sequence[int]) -> tuple[list[int], TreeNode]:
        """Longest cached prefix of ``key`` in whole pages: (slot ids, node ending it; root when none).
        O(len(key)) however deep the path: each node on it is one slice compare, only the last (partly matched)
        one is compared token by token."""
        self._tick += 1
        key = list(key[: len(key) - len(key) % self.page_size])
        end, i = len(key), 0
        node = self.root
        slots: list[int] = []
        while i < end:
            child = node.children.get(self._child_key(node, namespace, key[i : i + self.page_size]))
            if child is None:
                break
            child.last_access = self._tick
            m = len(child.key)
            if i + m <= end and key[i : i + m] == child.key:  # the whole node (the common case)
                slots.extend(child.value)
                node = child
                i += m
                continue
            n = self._match_len(child.key, key[i:])
            if n > 0:
                node = self._split(child, n)
                slots.extend(node.value)
            break
        return slots, node

    def peek(self, namespace: str, key: Sequence[int], at: tuple[TreeNode, int] | None = None) -> int:
        """Tokens of the longest cached prefix of ``key`` in whole pages: the length ``match`` would return.
        Read-only: no node split, no access time or tick change, no lock ref. O(len(key)); with ``at`` (a node
        and its depth in tokens, the first ``depth`` tokens of ``key`` being its path, which the caller
        guarantees: a request's locked node) the walk starts there, O(len(key) - depth)."""
        p = self.page_size
        end = len(key) - len(key) % p
        node, i = at if at is not None else (self.root, 0)
        while i < end:
            child = node.children.get(self._child_key(node, namespace, key[i : i + p]))
            if child is None:
                break
            m = len(child.key)
            if i + m <= end and list(key[i : i + m]) == child.key:  # the whole node (the common case): one compare
                i += m
                node = child
                continue
            return i + self._match_len(child.key, list(key[i:end]))
        return i

    def insert(self, namespace: str, key: Sequence[int], value: Sequence[int],
               at: tuple[TreeNode, int] | None = None) -> tuple[int, TreeNode]:
        """Stores ``key`` -> ``value`` (same length, a multiple of page_size).

        Returns (tokens of ``key`` that were already cached, node ending ``key``). The caller owns the slots
        ``value[:already]`` it brought and must free them (they duplicate cached ones); ``value[already:]``
        now belongs to the tree. ``at``: as for ``peek`` (the walk starts at that node, whose path is the first
        ``depth`` tokens of ``key``: a request's locked prefix, so the tokens compared are its new ones, not its
        prompt; the nodes up to it get the access time as a walk from the root gives them). Raises
        InvalidArgument for differing or unaligned lengths.
        """
        if len(key) != len(value):
            raise InvalidArgument(f"key has {len(key)} tokens but value has {len(value)} slots")
        self._check_key(key)
        self._tick += 1
        node, i = at if at is not None else (self.root, 0)
        up = node
        while up is not self.root:
            up.last_access = self._tick
            up = up.parent  # type: ignore[assignment]
        key, value = list(key[i:]), list(value[i:])
        base, end, i = i, len(key), 0
        while i < end:  # as ``match``: a slice compare per whole node, O(len(key)) however deep the path
            child = node.children.get(self._child_key(node, namespace, key[i : i + self.page_size]))
            if child is None:
                break
            child.last_access = self._tick
            m = len(child.key)
            if i + m <= end and key[i : i + m] == child.key:
                node = child
                i += m
                continue
            n = self._match_len(child.key, key[i:])
            if n > 0:
                node = self._split(child, n)
                i += n
            break
        already = base + i
        if i < end:
            rest = key[i:]
            leaf = TreeNode(next(self._ids), namespace, rest, value[i:], node)
            leaf.last_access = self._tick
            node.children[self._child_key(node, namespace, rest)] = leaf
            self.evictable_size += len(rest)
            node = leaf
        return already, node

    # ---- locks ---------------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> int:
        """Adds one lock ref from ``node`` up to the root; returns tokens that moved evictable -> protected."""
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                delta += len(node.value)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]
        self.evictable_size -= delta
        self.protected_size += delta
        return delta

    def unlock(self, node: TreeNode) -> int:
        """Removes one lock ref from ``node`` up to the root; returns tokens that moved protected -> evictable.
        Raises FailedPrecondition (changing nothing) when a node on the path is not locked."""
        walk = node
        while walk is not self.root:
            if walk.lock_ref <= 0:
                raise FailedPrecondition(f"unlock of an unlocked node {walk!r}")
            walk = walk.parent  # type: ignore[assignment]
        delta = 0
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                delta += len(node.value)
            node = node.parent  # type: ignore[assignment]
        self.evictable_size += delta
        self.protected_size -= delta
        return delta

    # ---- eviction ------------------------------------------------------------------------------
    def evict(self, num_tokens: float, release: Callable[[list[int]], None]) -> tuple[int, int, list[TreeNode]]:
        """Removes least recently used unlocked leaves until ``num_tokens`` were released or none is left.

        ``release(slot_ids)`` is called for each removed node. Returns (tokens released, nodes removed,
        the removed nodes). ``evict(0)`` does nothing; ``evict(float('inf'))`` removes every unlocked node.
        """
        if num_tokens <= 0:
            return 0, 0, []
        heap = [(n.last_access, n.id, n) for n in self.nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        released = 0
        removed: list[TreeNode] = []
        while released < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            release(leaf.value)
            released += len(leaf.value)
            self.evictable_size -= len(leaf.value)
            del parent.children[self._child_key(parent, leaf.namespace, leaf.key)]
            removed.append(leaf)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return released, len(removed), removed

    # ---- inspection ----------------------------------------------------------------------------
    def nodes(self) -> Iterator[TreeNode]:
        """Every node except the root (depth first, iterative)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def path_key(self, node: TreeNode) -> tuple[list[int], list[int]]:
        """(token ids, slot ids) from the root down to ``node``."""
        parts: list[TreeNode] = []
        while node is not self.root:
            parts.append(node)
            node = node.parent  # type: ignore[assignment]
        key: list[int] = []
        value: list[int] = []
        for part in reversed(parts):
            key.extend(part.key)
            value.extend(part.value)
        return key, value

    def clone(self) -> tuple["RadixTree", dict[int, TreeNode]]:
        """An independent copy and a map old node id -> new node (root included under id 0)."""
        other = RadixTree(self.page_size)
        start = next(self._ids)
        self._ids = itertools.count(start)  # a copy (the integrity check's) must not consume an id of the original
        other._ids = itertools.count(start)
        other.evictable_size = self.evictable_size
        other.protected_size = self.protected_size
        other._tick = self._tick
        mapping: dict[int, TreeNode] = {0: other.root}
        stack = [(self.root, other.root)]
        while stack:
            old, new = stack.pop()
            for ck, child in old.children.items():
                copy = TreeNode(child.id, child.namespace, list(child.key), list(child.value), new)
                copy.lock_ref = child.lock_ref
                copy.last_access = child.last_access
                new.children[ck] = copy
                mapping[child.id] = copy
                stack.append((child, copy))
        return other, mapping
