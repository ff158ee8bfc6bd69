"""Repeated integer fields of protobuf messages (token ids, slot ids) as Python ints, fast for long ones.

upb's repeated scalar container makes a Python int per element when it is iterated or sliced: ``list(field)`` of a
1,750-token prompt took 79 us and ``field[:]`` 52 us on the 2-core CPU box, and a keystroke's completion carries
its whole file's ids through the scheduler, the cache and the worker several times. numpy reads the container in
one call (``np.array(field)``: 5 us for 1,750) and ``ndarray.tolist`` makes the ints in C (28 us). A short field
(a decode step's one token) stays on the slice: numpy's fixed cost is more than a few elements cost.
"""

from __future__ import annotations

import numpy as np

LONG = 64  # fields longer than this go through numpy


def as_list(field) -> list[int]:
    """The field's values as a list of Python ints."""
    return np.array(field).tolist() if len(field) > LONG else field[:]


def as_tuple(field) -> tuple[int, ...]:
    """The field's values as a tuple of Python ints."""
    return tuple(as_list(field))
