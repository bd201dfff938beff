"""Triton's response cache (its ``local`` cache): a model whose ``config.pbtxt`` has
``response_cache { enable: true }`` answers a request it has answered before from memory.

One cache per process, within ``GELU_RESPONSE_CACHE_BYTES`` (0: off), least recently used
entries evicted first. An entry is keyed on its owners, the loaded versions whose answer it is
(a model's version; an ensemble's version and the version each of its steps resolved to, so a
step moving to a new version never answers from the old one's entries: issue 62, item 8), the
outputs asked for, and each input's name, datatype, shape and contents. The key is the request
itself, not a digest of it: a tuple that the dictionary hashes and, on a hit, compares whole,
so two different requests never share an entry (an input of the same bytes under another
datatype or shape is another key). Only an input above ``EXACT_BYTES`` is keyed by its
BLAKE2b-256 digest instead of its bytes, so that an entry does not hold a copy of a large
input: two such inputs share a key only if BLAKE2b collides (about 2^-128 for a pair). An
entry goes when any of its owners is retired (a reloaded version never answers from its
predecessor's entries). Only results are cached, never errors; the arrays are copied in and
kept read-only, and an entry's size counts them and the input bytes its key holds.
There is no lock: every lookup and change runs on the core's event loop (both faces serve
from it).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np

Outputs = dict[str, np.ndarray]
# The key: (owners' ids, outputs asked for, (name, datatype, shape, contents) per input).
Key = tuple[Any, ...]
ENTRY_OVERHEAD = 256  # bytes counted per entry beside its arrays: key, dict, array headers
EXACT_BYTES = 64 * 1024  # inputs up to this size are keyed by their bytes, above by a digest


def _contents(array: np.ndarray) -> Any:
    """What stands for an input's values in a key: its bytes (for BYTES, its values), or
    above ``EXACT_BYTES`` a 1-tuple of its BLAKE2b-256 digest (a tuple never equals bytes)."""
    if array.dtype == object:  # BYTES: the values, not their addresses
        return tuple(array.ravel().tolist())
    if array.nbytes <= EXACT_BYTES:
        return array.tobytes()
    return (hashlib.blake2b(np.ascontiguousarray(array).data, digest_size=32).digest(),)


def _held(key: Key) -> int:
    """The input bytes a key holds (a BYTES value: its length, or 8 if it has none)."""
    held = 0
    for part in key[2:]:
        contents = part[3]
        if isinstance(contents, bytes):
            held += len(contents)
        else:
            held += sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in contents)
    return held


class ResponseCache:
    """Results by request, least recently used first out, within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._entries: OrderedDict[Key, tuple[Outputs, int, tuple[Any, ...]]] = OrderedDict()

    def key(
        self, owners: tuple[Any, ...], inputs: dict[str, np.ndarray], outputs: list[str] | None
    ) -> Key:
        """The key of a request answered by ``owners`` (loaded versions, each live while its
        entries are: ``drop``), its checked inputs and the outputs it asks for (None: all)."""
        asked = None if outputs is None else tuple(outputs)
        ids = tuple(map(id, owners))
        if len(inputs) == 1:  # the common case, without a sort
            ((name, given),) = inputs.items()
            return ids, asked, (name, given.dtype.str, given.shape, _contents(given))
        parts = [(n, a.dtype.str, a.shape, _contents(a)) for n, a in sorted(inputs.items())]
        return (ids, asked, *parts)

    def get(self, key: Key) -> Outputs | None:
        """The answer kept for ``key``, or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Key, results: Outputs, owners: tuple[Any, ...]) -> None:
        """Keep ``results`` (copied) for ``key`` (of ``owners``), evicting the least recently
        used entries to stay within the budget; one larger than the whole budget is not kept."""
        if key in self._entries:
            return
        kept = {}
        for name, array in results.items():
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            kept[name] = copy
        size = sum(a.nbytes for a in kept.values()) + _held(key) + ENTRY_OVERHEAD
        if size > self.budget:
            return
        while self.used + size > self.budget:
            _, (_, freed, _) = self._entries.popitem(last=False)
            self.used -= freed
        self._entries[key] = (kept, size, owners)
        self.used += size

    def drop(self, owner: Any) -> None:
        """Forget every entry ``owner`` (a version being retired) is one of the owners of."""
        for key in [k for k, (_, _, o) in self._entries.items() if any(x is owner for x in o)]:
            self.used -= self._entries.pop(key)[1]

    def __len__(self) -> int:
        return len(self._entries)
