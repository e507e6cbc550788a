"""What warm workers keep of the items create writes and nothing changes: input chunks and lane
positions, read again and again by every request of a batch."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class LruCache:
    """Least recently used first out, up to a total weight (`weigh` of each value; by default
    each counts one)."""

    def __init__(self, size: int, weigh: Callable[[Any], int] = lambda _: 1) -> None:
        self._size = size
        self._weigh = weigh
        self._weight = 0
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: Any) -> Any:
        with self._lock:
            if name in self._items:
                self._items.move_to_end(name)
                return self._items[name]
        return None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._weight = 0

    def put(self, name: Any, value: Any) -> None:
        weight = self._weigh(value)
        if weight > self._size:
            return  # bigger than the whole cache: keeping it would evict everything else
        with self._lock:
            if name in self._items:
                self._weight -= self._weigh(self._items.pop(name))
            self._items[name] = value
            self._weight += weight
            while self._weight > self._size:
                _, evicted = self._items.popitem(last=False)
                self._weight -= self._weigh(evicted)


# Chunks are weighed by their bodies' bytes, so a worker's cache stays small beside its 256 MB
# whatever the batches hold (one chunk may be a single 32 MiB request: too big to keep). The
# worker's memory budget counts it (worker/memory.py).
CHUNK_CACHE_BYTES = 16 * 1024 * 1024
chunks = LruCache(CHUNK_CACHE_BYTES, weigh=lambda run: run.size)
lane_positions = LruCache(256)
