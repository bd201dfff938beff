"""Triton's response cache (its ``local`` cache): a model whose ``config.pbtxt`` has
``response_cache { enable: true }`` answers a request it has answered before from memory.

One cache per process, within ``GELU_RESPONSE_CACHE_BYTES`` (0: off), least recently used
entries evicted first. An entry is keyed on its owners, the loaded versions whose answer it is
(a model's version; an ensemble's version and the version each of its steps resolved to, so a
step moving to a new version never answers from the old one's entries: issue 62, item 8), the
outputs asked for, and each input's name, datatype, shape and bytes (BLAKE2b, 128 bits: one
pass over the inputs, then one dictionary lookup). An entry goes when any of its owners is
retired (a reloaded version never answers from its predecessor's entries). Only results are
cached, never errors; the arrays are copied in and kept read-only, so an entry's size is what it
holds.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np

Outputs = dict[str, np.ndarray]
ENTRY_OVERHEAD = 256  # bytes counted per entry beside its arrays: key, dict, array headers


class ResponseCache:
    """Results by request, least recently used first out, within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._entries: OrderedDict[bytes, tuple[Outputs, int, tuple[Any, ...]]] = OrderedDict()

    def key(
        self, owners: tuple[Any, ...], inputs: dict[str, np.ndarray], outputs: list[str] | None
    ) -> bytes:
        """The key of a request answered by ``owners`` (loaded versions, each live while its
        entries are: ``drop``), its checked inputs and the outputs it asks for (None: all)."""
        digest = hashlib.blake2b(digest_size=16)
        for owner in owners:
            digest.update(b"%d|" % id(owner))
        digest.update(repr(outputs).encode())
        for name in sorted(inputs):
            given = inputs[name]
            digest.update(f"|{name}|{given.dtype.str}|{given.shape}|".encode())
            if given.dtype == object:  # BYTES: the values, not their addresses
                digest.update(repr(given.tolist()).encode())
            else:
                digest.update(np.ascontiguousarray(given).data)
        return digest.digest()

    def get(self, key: bytes) -> Outputs | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: bytes, results: Outputs, owners: tuple[Any, ...]) -> None:
        """Keep ``results`` (copied) for ``key`` (of ``owners``), evicting the least recently
        used entries to stay within the budget; one larger than the whole budget is not kept."""
        if key in self._entries:
            return
        kept = {}
        for name, array in results.items():
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            kept[name] = copy
        size = sum(a.nbytes for a in kept.values()) + ENTRY_OVERHEAD
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
