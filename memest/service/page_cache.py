"""Small values derived from immutable reports, kept per key (a bounded LRU, thread-safe): what a
page takes from each of thousands of runs, so that page never parses them all again."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class EntryCache(Generic[V]):
    """Values by key, the least recently used dropped past ``size``."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[object, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: object) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: object, value: V) -> None:
        if not self._size:
            return
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
