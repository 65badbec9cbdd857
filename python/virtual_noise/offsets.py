"""Flat noise offsets of parameter blocks."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def compute_offsets(shapes: Iterable[Sequence[int] | int]) -> list[int]:
    """Cumulative flat offsets of parameter blocks laid end to end.

    Block ``k`` draws its noise from element indices ``offsets[k] ..
    offsets[k] + numel(shapes[k])``, so no two blocks share noise.

    >>> compute_offsets([(256, 784), (256,), (10, 256), (10,)])
    [0, 200704, 200960, 203520]
    """
    offsets, total = [], 0
    for i, shape in enumerate(shapes):
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        if not all(isinstance(d, int) and d >= 0 for d in dims):
            raise ValueError(f"compute_offsets: shapes[{i}] must hold non-negative ints; got {shape!r}")
        offsets.append(total)
        total += math.prod(dims)
    return offsets
