"""Training state as a file that runs no code when read: a NumPy ``.npz`` archive holding the
state's tree as JSON (member ``tree``, UTF-8 bytes) and each array in it as a member of its
own, written and read with ``allow_pickle=False``.

A tree is made of dicts (any keys), lists, tuples, None, bools, ints (any size: a NumPy PCG64
state's exceed 64 bits, and JSON keeps them exact), floats (NaN and infinities included),
strings, NumPy arrays and scalars, and torch tensors (read back as CPU tensors). Each value
reads back as the type it was written as, so a resumed run continues bit for bit.

In the JSON, an object is a dict with string keys; a value JSON has no type for is an object
with one ``$`` key: ``{"$tuple": [...]}``, ``{"$dict": [[key, value], ...]}`` (a dict with a
key that is not a string, or starts with ``$``), ``{"$array": i}``, ``{"$scalar": i}`` (a
NumPy scalar) and ``{"$torch": i}``, with ``i`` the member holding the array.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Any

import numpy as np

TREE = "tree"
ZIP_MAGIC = b"PK\x03\x04"
_ARRAY_TAGS = ("$array", "$scalar", "$torch")


def dump(tree: Any, file: IO[bytes]) -> None:
    """Write ``tree`` into ``file``; TypeError for a value a tree cannot hold."""
    arrays: list[np.ndarray] = []
    document = json.dumps(_encode(tree, arrays), separators=(",", ":"))
    members = {str(i): array for i, array in enumerate(arrays)}
    members[TREE] = np.frombuffer(document.encode(), dtype=np.uint8)
    np.savez(file, allow_pickle=False, **members)


def load(path: Path) -> Any:
    """The tree a ``dump`` wrote to ``path``; an exception for anything else (a pickle, an
    object array, a truncated or corrupt archive: zip checksums cover every member)."""
    with open(path, "rb") as file:  # np.load would take a lone .npy array too
        if file.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
            raise ValueError("not an .npz archive")
    with np.load(path, allow_pickle=False) as archive:
        return _decode(json.loads(archive[TREE].tobytes().decode()), archive)


def _encode(value: Any, arrays: list[np.ndarray]) -> Any:
    def member(array: np.ndarray) -> int:
        arrays.append(array)
        return len(arrays) - 1

    torch = sys.modules.get("torch")
    if isinstance(value, np.generic):  # before float: np.float64 is one
        return {"$scalar": member(np.asarray(value))}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        return {"$array": member(value)}
    if torch is not None and isinstance(value, torch.Tensor):
        return {"$torch": member(value.detach().cpu().numpy())}
    if isinstance(value, list):
        return [_encode(item, arrays) for item in value]
    if type(value) is tuple:  # a named tuple would read back as a plain one
        return {"$tuple": [_encode(item, arrays) for item in value]}
    if isinstance(value, dict):
        if all(isinstance(key, str) and not key.startswith("$") for key in value):
            return {key: _encode(item, arrays) for key, item in value.items()}
        return {"$dict": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
    raise TypeError(f"a saved state cannot hold a {type(value).__name__}")


def _decode(node: Any, archive: Any) -> Any:
    if isinstance(node, list):
        return [_decode(item, archive) for item in node]
    if not isinstance(node, dict):
        return node
    if not any(key.startswith("$") for key in node):
        return {key: _decode(item, archive) for key, item in node.items()}
    ((tag, content),) = node.items()  # a tagged value has one key
    if tag == "$tuple":
        return tuple(_decode(item, archive) for item in content)
    if tag == "$dict":
        return {_decode(k, archive): _decode(v, archive) for k, v in content}
    if tag not in _ARRAY_TAGS:
        raise ValueError(f"unknown value kind {tag}")
    array = archive[str(content)]
    if tag == "$scalar":
        return array[()]
    if tag == "$torch":
        import torch

        return torch.from_numpy(array)
    return array
