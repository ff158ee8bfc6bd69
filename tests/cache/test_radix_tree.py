"""RadixTree unit tests with concrete values (SGLang RadixCache semantics)."""

from __future__ import annotations

import pytest

from cache_svc.errors import FailedPrecondition, InvalidArgument
from cache_svc.radix_tree import RadixTree


def shape(tree: RadixTree) -> dict:
    """Nested {tuple(key): children-shape} from the root."""
    def walk(node):
        return {tuple(c.key): walk(c) for c in node.children.values()}
    return walk(tree.root)


def released_into(bucket: list):
    return lambda slots: bucket.extend(slots)


def test_insert_123_then_124_match_125_gives_two_and_the_expected_shape() -> None:
    tree = RadixTree()
    assert tree.insert("", [1, 2, 3], [11, 12, 13])[0] == 0
    assert tree.insert("", [1, 2, 4], [21, 22, 24])[0] == 2
    slots, node = tree.match("", [1, 2, 5])
    assert slots == [11, 12] and node.key == [1, 2]
    assert shape(tree) == {(1, 2): {(3,): {}, (4,): {}}}
    assert tree.evictable_size == 4  # [1,2] + [3] + [4]; the caller frees its duplicates 21, 22


def test_duplicate_insert_returns_full_prefix_and_keeps_old_slots() -> None:
    tree = RadixTree()
    tree.insert("", [7, 8, 9], [1, 2, 3])
    already, node = tree.insert("", [7, 8, 9], [4, 5, 6])
    assert already == 3
    assert tree.match("", [7, 8, 9])[0] == [1, 2, 3]
    assert tree.evictable_size == 3 and node.value == [1, 2, 3]


def test_split_during_match_changes_no_size_and_copies_lock_ref() -> None:
    tree = RadixTree()
    _, leaf = tree.insert("", [1, 2, 3, 4], [10, 11, 12, 13])
    tree.lock(leaf)
    assert (tree.evictable_size, tree.protected_size) == (0, 4)
    slots, upper = tree.match("", [1, 2, 9])
    assert slots == [10, 11] and upper.key == [1, 2] and leaf.key == [3, 4]
    assert upper.lock_ref == leaf.lock_ref == 1
    assert (tree.evictable_size, tree.protected_size) == (0, 4)


def test_lock_unlock_deltas_and_nested_locks() -> None:
    tree = RadixTree()
    _, a = tree.insert("", [1, 2], [1, 2])
    _, b = tree.insert("", [1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    assert tree.lock(b) == 5          # [1,2] and [3,4,5] both become protected
    assert tree.lock(a) == 0          # already protected through b
    assert (a.lock_ref, b.lock_ref) == (2, 1)
    assert tree.unlock(b) == 3        # [3,4,5] free again, [1,2] still held by a
    assert tree.unlock(a) == 2
    assert (tree.evictable_size, tree.protected_size) == (5, 0)
    with pytest.raises(FailedPrecondition):
        tree.unlock(a)


def test_lru_order_evicts_least_recently_used_leaf_first() -> None:
    tree = RadixTree()
    tree.insert("", [1], [1])
    tree.insert("", [2], [2])
    tree.insert("", [3], [3])
    tree.match("", [1])               # touch 1: now 2 is the oldest
    freed: list[int] = []
    tree.evict(1, released_into(freed))
    assert freed == [2]
    tree.evict(1, released_into(freed))
    assert freed == [2, 3]


def test_cascade_eviction_frees_more_than_asked() -> None:
    tree = RadixTree()
    tree.insert("", [1, 2, 3, 4], [1, 2, 3, 4])
    tree.insert("", [1, 2, 3, 4, 5], [1, 2, 3, 4, 5])   # leaf [5] under [1,2,3,4]
    freed: list[int] = []
    released, nodes, _ = tree.evict(2, released_into(freed))
    assert (released, nodes) == (5, 2) and sorted(freed) == [1, 2, 3, 4, 5]
    assert tree.evictable_size == 0 and shape(tree) == {}


def test_evicting_more_than_exists_frees_what_exists_and_spares_locked() -> None:
    tree = RadixTree()
    _, locked = tree.insert("", [1, 2], [1, 2])
    tree.insert("", [1, 2, 3], [1, 2, 3])
    tree.insert("", [9], [9])
    tree.lock(locked)
    freed: list[int] = []
    released, nodes, _ = tree.evict(100, released_into(freed))
    assert released == 2 and sorted(freed) == [3, 9] and nodes == 2
    assert tree.protected_size == 2 and tree.evictable_size == 0
    assert tree.evict(0, released_into(freed)) == (0, 0, [])


def test_paged_match_is_truncated_to_whole_pages() -> None:
    tree = RadixTree(page_size=4)
    tree.insert("", list(range(8)), list(range(4, 12)))
    assert tree.match("", list(range(7)))[0] == [4, 5, 6, 7]        # 7 tokens -> one whole page
    assert tree.match("", [0, 1, 2, 3, 4, 5, 9, 9])[0] == [4, 5, 6, 7]  # differs inside page 2
    assert tree.match("", list(range(8)) + [1])[0] == list(range(4, 12))
    assert tree.insert("", [0, 1, 2, 3, 4, 5, 6, 99], list(range(16, 24)))[0] == 4
    with pytest.raises(InvalidArgument):
        tree.insert("", [1, 2, 3], [1, 2, 3])


def test_namespaces_never_share_a_prefix() -> None:
    tree = RadixTree()
    tree.insert("lora-a", [1, 2, 3], [1, 2, 3])
    assert tree.match("lora-b", [1, 2, 3])[0] == []
    assert tree.insert("lora-b", [1, 2, 3], [4, 5, 6])[0] == 0
    assert tree.match("lora-a", [1, 2, 3])[0] == [1, 2, 3]
    assert tree.match("lora-b", [1, 2, 3])[0] == [4, 5, 6]
    assert tree.match("", [1, 2, 3])[0] == []


def test_insert_rejects_differing_lengths() -> None:
    with pytest.raises(InvalidArgument, match="3 tokens but value has 2"):
        RadixTree().insert("", [1, 2, 3], [1, 2])


def keystroke_chain(tree: RadixTree, keystrokes: int, page: int = 1) -> list[list[int]]:
    """The prompts of one typist: a file head, then one page typed before a fixed tail per keystroke, each
    inserted as it was computed (slot = 1000 + position's token): a path of ``keystrokes`` small nodes."""
    head, tail = list(range(1, 33)), [900 + i for i in range(8 * page)]
    prompts = []
    for k in range(keystrokes):
        head = head + [500 + k] * page
        prompt = head + tail
        tree.insert("", prompt, [1000 + t for t in prompt])
        prompts.append(prompt)
    return prompts


@pytest.mark.parametrize("page", [1, 2])
def test_a_deep_path_is_matched_and_inserted_whole_node_by_whole_node(page: int) -> None:
    """Match and insert walk a path of 40 one-keystroke nodes with one slice compare per node: the token-by-token
    scan (``_match_len``) runs only for the last, partly matched node, not once per node (that was O(depth x
    len(key)) per call, the cost of every Match and CacheRequests of a typist's prompt)."""
    tree = RadixTree(page)
    prompts = keystroke_chain(tree, 40, page)
    scans: list[int] = []
    scan = tree._match_len
    tree._match_len = lambda a, b: scans.append(1) or scan(a, b)  # type: ignore[method-assign]
    last = prompts[-1]
    assert tree.insert("", last, [2000 + t for t in last]) == (len(last), tree.match("", last)[1])
    slots, node = tree.match("", last[:-page])  # ends inside the tail node: one scan, one split
    assert slots == [1000 + t for t in last[:-page]] and node.key == last[-9 * page:-page]  # its keystroke + tail
    typed = last[:-8 * page] + [777] * page  # the next keystroke: differs from every tail in its first page
    assert tree.match("", typed)[0] == [1000 + t for t in last[:-8 * page]]
    assert tree.insert("", typed, list(range(len(typed))))[0] == len(typed) - page
    assert len(scans) <= 4  # the partial node of each call, never one per node of the path
    assert tree.peek("", last) == len(last) and tree.peek("", typed) == len(typed)


@pytest.mark.parametrize("page", [1, 2])
def test_insert_and_peek_from_a_node_equal_the_walk_from_the_root(page: int) -> None:
    """``at`` (a request's locked node and its depth): the walk starts there. The results (already cached, the node
    ending the key, the tree's shape, the tokens compared) are the root walk's, the nodes from the root to ``at``
    get the insert's access time as a walk through them gives it, and the tokens above ``at`` are not compared."""
    trees = [RadixTree(page), RadixTree(page)]
    for tree in trees:
        keystroke_chain(tree, 6, page)
        tree.insert("", [1, 2] * page + [3] * page, [50] * 3 * page)  # a sibling path the walks must not take
    prefix = list(range(1, 33)) + [500] * page  # the first keystroke's head: a node of both trees
    key = prefix + [600] * 2 * page + [601] * page
    value = [7000 + i for i in range(len(key))]
    nodes = [tree.match("", prefix)[1] for tree in trees]
    assert [len(tree.path_key(n)[0]) for tree, n in zip(trees, nodes)] == [len(prefix)] * 2
    compared: list[int] = []
    scan = trees[1]._match_len
    trees[1]._match_len = lambda a, b: compared.append(len(b)) or scan(a, b)  # type: ignore[method-assign]
    assert trees[0].peek("", key) == trees[1].peek("", key, (nodes[1], len(prefix))) == len(prefix)
    root_walk, from_node = trees[0].insert("", key, value), trees[1].insert("", key, value, (nodes[1], len(prefix)))
    assert root_walk[0] == from_node[0] == len(prefix)
    (k0, v0), (k1, v1) = trees[0].path_key(root_walk[1]), trees[1].path_key(from_node[1])
    assert (k0, v0) == (k1, v1) and k0 == key and v0[len(prefix):] == value[len(prefix):]
    assert shape(trees[0]) == shape(trees[1]) and trees[0].evictable_size == trees[1].evictable_size
    assert all(len(b) <= len(key) - len(prefix) for b in compared)  # never a token above the node
    node = from_node[1]
    while node is not trees[1].root:  # the whole path carries the insert's access time
        assert node.last_access == trees[1]._tick
        node = node.parent
    again = trees[1].insert("", key, value, (nodes[1], len(prefix)))  # all cached: nothing new, the same node
    assert again == (len(key), from_node[1]) and trees[1].peek("", key, (nodes[1], len(prefix))) == len(key)
