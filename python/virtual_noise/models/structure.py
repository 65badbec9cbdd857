"""Tensors in nested inputs and outputs: flatten to a list, rebuild the same structure.

Handles tensors, tuples (named ones too), lists, dicts, and dataclasses (Hugging
Face's ModelOutput among them); anything else is a constant leaf.
"""

from __future__ import annotations

import dataclasses

import torch


def flatten(obj, leaves: list, drop_tensor_holders: bool = False) -> object:
    """Append obj's tensors to ``leaves``; return a spec that ``unflatten`` rebuilds obj from.

    With ``drop_tensor_holders``, constant leaves that hold tensors (a cache object,
    say, whose tensors cannot leave a batched call) become None.
    """
    def sub(v):
        return flatten(v, leaves, drop_tensor_holders)

    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return ("tensor", len(leaves) - 1)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = [f.name for f in dataclasses.fields(obj) if f.init]
        return ("dataclass", type(obj), names, [sub(getattr(obj, n)) for n in names])
    if isinstance(obj, dict):
        return ("dict", type(obj), list(obj), [sub(v) for v in obj.values()])
    if isinstance(obj, tuple):
        return ("tuple", type(obj), [sub(v) for v in obj])
    if isinstance(obj, list):
        return ("list", None, [sub(v) for v in obj])
    return ("const", None if drop_tensor_holders and holds_tensors(obj) else obj)


def flatten_call(args: tuple, kwargs: dict, leaves: list) -> tuple[object, list]:
    """A call's (args, kwargs) flattened as ``flatten((args, kwargs), leaves)`` does; also returns, for
    every tensor leaf, the argument it came from (its position in args, or its keyword)."""
    keys = []
    parts = {}
    for key, value in [*enumerate(args), *kwargs.items()]:
        before = len(leaves)
        parts[key] = flatten(value, leaves)
        keys += [key] * (len(leaves) - before)
    spec = ("tuple", tuple, [("tuple", tuple, [parts[i] for i in range(len(args))]),
                             ("dict", dict, list(kwargs), [parts[k] for k in kwargs])])
    return spec, keys


def unflatten(spec, leaves: list):
    kind = spec[0]
    if kind == "tensor":
        return leaves[spec[1]]
    if kind == "const":
        return spec[1]
    if kind == "dataclass":
        _, cls, names, parts = spec
        return cls(**{n: unflatten(p, leaves) for n, p in zip(names, parts)})
    if kind == "dict":
        _, cls, keys, parts = spec
        values = [unflatten(p, leaves) for p in parts]
        return cls(zip(keys, values)) if cls is not dict else dict(zip(keys, values))
    _, cls, parts = spec
    values = [unflatten(p, leaves) for p in parts]
    if kind == "list":
        return values
    return cls(*values) if hasattr(cls, "_fields") else cls(values)


def holds_tensors(obj) -> bool:
    """Whether a constant leaf holds tensors (a cache object, say), which cannot leave a batched call."""
    seen = vars(obj) if hasattr(obj, "__dict__") else {}
    for v in seen.values():
        if isinstance(v, torch.Tensor):
            return True
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) or hasattr(x, "__dict__") and
                                                 any(isinstance(y, torch.Tensor) for y in vars(x).values())
                                                 for x in v):
            return True
    return False
