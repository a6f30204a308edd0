"""List responses from per-record encodings: kubelet's PLEG lists every pod and container each second, and
building N protobuf messages from Python on each call cost far more than the call itself (1.3 ms for 100
pods against 0.04 ms to decode the same response from bytes).

Each record's list item is encoded once, as a one-item response (field tag and length included), and kept
with the record object it came from; the store replaces a record on every change (records are frozen), so an
item is encoded again exactly when its record changed. A response is the concatenation of its items' bytes,
decoded in C.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable


class EncodedItems:
    """`response_type(**{field: [convert(record)]})` encoded per record, cached by record identity."""

    def __init__(self, response_type: Any, field: str, convert: Callable[[Any], Any]) -> None:
        self.response_type = response_type
        self.field = field
        self.convert = convert
        self._cache: dict[str, tuple[Any, bytes]] = {}    # record id -> (the record, its encoded item)

    def encoded(self, record: Any) -> bytes:
        hit = self._cache.get(record.id)
        if hit is not None and hit[0] is record:
            return hit[1]
        data = self.response_type(**{self.field: [self.convert(record)]}).SerializeToString()
        self._cache[record.id] = (record, data)
        return data

    def response(self, records: Iterable[Any], live: Callable[[], Iterable[Any]]) -> Any:
        """The response listing `records`; `live()` gives every record that exists (to drop the others)."""
        data = b"".join([self.encoded(r) for r in records])
        if len(self._cache) > 64:
            ids = {r.id for r in live()}
            if len(self._cache) > 2 * len(ids) + 64:
                self._cache = {k: v for k, v in self._cache.items() if k in ids}
        return self.response_type.FromString(data)

    def __len__(self) -> int:
        return len(self._cache)
