"""List responses from per-record encodings: kubelet's PLEG lists every pod and container each second, and
building N protobuf messages from Python on each call cost far more than the call itself (1.3 ms for 100
pods against 0.04 ms to decode the same response from bytes).

Each record's list item is encoded once, as a one-item response (field tag and length included), and kept
with the record object it came from; the store replaces a record on every change (records are frozen), so an
item is encoded again exactly when its record changed. A response is the concatenation of its items' bytes,
decoded in C. Items of removed records are dropped at the next response.

Also the room a List response has: an unfiltered List must fit in one gRPC message (kubelet's and husk-cri's
limit, 16 MiB). ListPodSandboxStats carries every pod's labels and annotations and, inside each, its
containers': so pods and containers share one budget, and a new object whose item would take the sum of all
pod and container items past LIST_BUDGET is refused.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from cri_server.errors import ResourceExhausted

MESSAGE_LIMIT = 16 << 20   # kubelet's max receive size; husk-cri's max send size (daemon.py)
# What List*Stats adds per item (attributes, cpu, memory: < 0.5 kB) and creations racing each other (each item
# is at most ~0.5 MiB: labels and annotations 256 KiB each) fit in the 2 MiB left.
LIST_BUDGET = MESSAGE_LIMIT - (2 << 20)


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
        everything = live()
        # Every cached id was a record once: more of them than records means some are gone. Dropped at once, so
        # a removed pod's big annotations do not stay in memory (a count is cheap: no set unless needed).
        if len(self._cache) > len(everything):     # type: ignore[arg-type]
            ids = {r.id for r in everything}
            self._cache = {k: v for k, v in self._cache.items() if k in ids}
        return self.response_type.FromString(data)

    def item_size(self, item: Any) -> int:
        """The encoded size of one list item (a pb message of the response's repeated field)."""
        return self.response_type(**{self.field: [item]}).ByteSize()

    def used(self, records: Iterable[Any]) -> int:
        """The encoded size of listing `records`."""
        return sum(len(self.encoded(r)) for r in records)

    def check_room(self, records: Iterable[Any], item: Any, what: str, besides: int = 0) -> None:
        """ResourceExhausted when listing `records` and `item`, plus `besides` bytes the same List*Stats
        response also carries (the other kind's items), would take more than LIST_BUDGET bytes."""
        size = self.item_size(item)
        used = self.used(records) + besides
        if used + size > LIST_BUDGET:
            raise ResourceExhausted(
                f"{what}: its labels and annotations ({size} bytes listed) would take the list of all pods "
                f"and containers (ListPodSandboxStats) to {used + size} bytes, past {LIST_BUDGET} (a List "
                f"response must stay under the {MESSAGE_LIMIT >> 20} MiB gRPC message limit)")

    def __len__(self) -> int:
        return len(self._cache)


def check_sandbox_room(svc: Any, req: Any) -> None:
    """RunPodSandbox: the new pod's ListPodSandbox item must fit next to every existing pod's."""
    from cri_server.api.v1 import api_pb2 as pb
    from cri_server.rpc import sandbox_status
    c = req.config
    item = pb.PodSandbox(id="0" * 64, metadata=c.metadata, state=pb.SANDBOX_READY, created_at=1 << 62,
                         labels=c.labels, annotations=c.annotations, runtime_handler=req.runtime_handler)
    from cri_server.rpc import container_status
    besides = container_status.list_items.used(svc.store.list_containers())
    sandbox_status.list_items.check_room(svc.store.list_sandboxes(), item, "config", besides)


def check_container_room(svc: Any, req: Any) -> None:
    """CreateContainer: the new container's ListContainers item must fit next to every existing container's."""
    from cri_server.api.v1 import api_pb2 as pb
    from cri_server.rpc import container_status
    c = req.config
    digest = "sha256:" + "0" * 64
    item = pb.Container(id="0" * 64, pod_sandbox_id="0" * 64, metadata=c.metadata,
                        image=pb.ImageSpec(image=c.image.image), image_ref=digest, image_id=digest,
                        state=pb.CONTAINER_CREATED, created_at=1 << 62, labels=c.labels, annotations=c.annotations)
    from cri_server.rpc import sandbox_status
    besides = sandbox_status.list_items.used(svc.store.list_sandboxes())
    container_status.list_items.check_room(svc.store.list_containers(), item, "config", besides)
