"""Triton's response cache (its ``local`` cache): a model whose ``config.pbtxt`` has
``response_cache { enable: true }`` answers a request it has answered before from memory.

One cache per process, within ``GELU_RESPONSE_CACHE_BYTES`` (0: off), least recently used
entries evicted first. An entry is keyed on its owners, the loaded versions whose answer it is
(a model's version; an ensemble's version and the version each of its steps resolved to, so a
step moving to a new version never answers from the old one's entries: issue 62, item 8), the
outputs asked for, and each input's name, datatype, shape and contents. The key is the request
itself, not a digest of it: a flat tuple that the dictionary hashes and, on a hit, compares
whole, so two different requests never share an entry (an input of the same bytes under another
datatype or shape is another key). Only an input above ``EXACT_BYTES`` is keyed by its
BLAKE2b-256 digest instead of its bytes, so that an entry does not hold a copy of a large
input: two such inputs share a key only if BLAKE2b collides (about 2^-128 for a pair). An
entry goes when any of its owners is retired (a reloaded version never answers from its
predecessor's entries). Only results are cached, never errors; the arrays are copied in and
kept read-only, and an entry's size counts them and the input bytes its key holds.
There is no lock: every lookup and change runs on the core's event loop (both faces serve
from it).

A miss pays for its key, one lookup and the copy of its outputs, and little more: an entry is
a flat key and an (outputs, size) pair, with no object the garbage collector must keep visiting
(the owners are held once per set of owners, not per entry), so that a cache filling with
misses does not make the collector's passes over the requests in flight more frequent.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np

Outputs = dict[str, np.ndarray]
# The key: (owners' ids, outputs asked for, then name, dtype, shape, contents of each input).
Key = tuple[Any, ...]
INPUT = 4  # the key's items per input, after the owners' ids and the outputs asked for
# What Python and numpy allocate beside the data, per entry, per kept array and per value of a
# BYTES input its key holds, so that small answers stay within the budget (measured: the
# "Growth" section of docs/security.md; tests/service/test_cache.py holds them to it).
ENTRY_OVERHEAD = 640
ARRAY_OVERHEAD = 176
VALUE_OVERHEAD = 48
EXACT_BYTES = 64 * 1024  # inputs up to this size are keyed by their bytes, above by a digest


def _contents(array: np.ndarray) -> Any:
    """What stands for an input's values in a key: its bytes (for BYTES, its values), or
    above ``EXACT_BYTES`` a 1-tuple of its BLAKE2b-256 digest (a tuple never equals bytes)."""
    if array.dtype.hasobject:  # BYTES: the values, not their addresses
        return tuple(array.ravel().tolist())
    if array.nbytes <= EXACT_BYTES:
        return array.tobytes()
    return (hashlib.blake2b(np.ascontiguousarray(array).data, digest_size=32).digest(),)


def _held(key: Key) -> int:
    """The input bytes a key holds (a BYTES value: its length and ``VALUE_OVERHEAD``)."""
    held = 0
    for contents in key[2 + INPUT - 1 :: INPUT]:
        if type(contents) is bytes:
            held += len(contents)
        else:
            held += sum(
                len(v) + VALUE_OVERHEAD if isinstance(v, (bytes, str)) else VALUE_OVERHEAD
                for v in contents
            )
    return held


class ResponseCache:
    """Results by request, least recently used first out, within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._entries: OrderedDict[Key, tuple[Outputs, int]] = OrderedDict()
        # The owners of the entries by their ids (a key's first item): held here, once, so
        # that no id in a key can name another object while an entry may carry it.
        self._owners: dict[Any, tuple[Any, ...]] = {}

    def key(
        self, owners: tuple[Any, ...], inputs: dict[str, np.ndarray], outputs: list[str] | None
    ) -> Key:
        """The key of a request answered by ``owners`` (loaded versions, each live while its
        entries are: ``drop``), its checked inputs and the outputs it asks for (None: all)."""
        asked = None if outputs is None else tuple(outputs)
        # One owner's id is an int, several a tuple of them: never equal to each other.
        ids = id(owners[0]) if len(owners) == 1 else tuple(map(id, owners))
        if len(inputs) == 1:  # the common case, without a sort or a call per input
            ((name, given),) = inputs.items()
            dtype = given.dtype
            if dtype.hasobject or given.nbytes > EXACT_BYTES:
                return ids, asked, name, dtype, given.shape, _contents(given)
            return ids, asked, name, dtype, given.shape, given.tobytes()
        key: list[Any] = [ids, asked]
        for name, given in sorted(inputs.items()):
            key += (name, given.dtype, given.shape, _contents(given))
        return tuple(key)

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
        kept = {}
        last = key[-1]  # one input's bytes: the common case, without a call
        held = len(last) if len(key) == 2 + INPUT and type(last) is bytes else _held(key)
        size = ENTRY_OVERHEAD + held
        for name, array in results.items():
            copy = array.copy()  # not a view: it would hold its whole batch's output
            # write=False, by position: a keyword costs a dict per call (numpy's stubs name it
            # keyword-only; numpy takes it either way).
            copy.setflags(False)  # type: ignore[call-arg]
            kept[name] = copy
            size += copy.nbytes + ARRAY_OVERHEAD
        if size > self.budget:
            return
        entry = (kept, size)
        if self._entries.setdefault(key, entry) is not entry:
            return  # another miss of the same request kept its answer first
        if key[0] not in self._owners:
            self._owners[key[0]] = owners
        self.used += size
        while self.used > self.budget:  # the oldest first: the new entry alone fits
            _, (_, freed) = self._entries.popitem(last=False)
            self.used -= freed

    def drop(self, owner: Any) -> None:
        """Forget every entry ``owner`` (a version being retired) is one of the owners of."""
        gone = {ids for ids, owners in self._owners.items() if any(o is owner for o in owners)}
        for ids in gone:
            del self._owners[ids]
        for key in [k for k in self._entries if k[0] in gone]:
            self.used -= self._entries.pop(key)[1]

    def __len__(self) -> int:
        return len(self._entries)
