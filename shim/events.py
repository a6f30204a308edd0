"""Publishes task events to containerd: ttrpc `containerd.services.events.ttrpc.v1.Events/Forward` on
TTRPC_ADDRESS, in order, retried while containerd is away (e.g. restarting).

Owns the queue and its retry timer on the shim's loop; each send is one short blocking call (containerd
answers Forward at once), so no thread is needed. Without an address, events are dropped (husk-cri polls).
"""
from __future__ import annotations

import time
from collections import deque

from shim import ttrpc_wire as w
from shim.ttrpc_call import call_once
from shim.loop import Loop
from shim.pb import events as ev
from shim.pb import events_service, google, types
from shim.protobuf import Message
from shim.log import get as get_logger

log = get_logger(__name__)

TOPICS = {
    ev.TaskCreate: "/tasks/create",
    ev.TaskStart: "/tasks/start",
    ev.TaskExit: "/tasks/exit",
    ev.TaskOOM: "/tasks/oom",
    ev.TaskExecAdded: "/tasks/exec-added",
    ev.TaskExecStarted: "/tasks/exec-started",
    ev.TaskDelete: "/tasks/delete",
    ev.TaskPaused: "/tasks/paused",
    ev.TaskResumed: "/tasks/resumed",
    ev.TaskCheckpointed: "/tasks/checkpointed",
}
MAX_QUEUE = 10000
RETRY_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0)


def now_ts() -> google.Timestamp:
    ns = time.time_ns()
    return google.Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


def ts_from_ns(ns: int) -> google.Timestamp:
    return google.Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


class Publisher:
    def __init__(self, loop: Loop, address: str | None, namespace: str) -> None:
        self.loop = loop
        self.address = address
        self.namespace = namespace
        self.queue: deque[events_service.ForwardRequest] = deque()
        self.failures = 0
        self._scheduled = False
        self.sent: list[str] = []        # topics, for tests and debugging (bounded below)

    def publish(self, event: Message) -> None:
        topic = TOPICS[type(event)]
        log.debug("event %s %r", topic, event)
        if not self.address:
            return
        env = types.Envelope(timestamp=now_ts(), namespace=self.namespace, topic=topic,
                             event=google.Any(type_url=event.FULL_NAME, value=event.encode()))
        if len(self.queue) >= MAX_QUEUE:
            log.error("event queue full; dropping %s", self.queue.popleft().envelope.topic)
        self.queue.append(events_service.ForwardRequest(envelope=env))
        self.flush()

    def flush(self) -> None:
        self._scheduled = False
        while self.queue:
            req = self.queue[0]
            try:
                call_once(self.address, "containerd.services.events.ttrpc.v1.Events", "Forward", req,
                          google.Empty, timeout=5.0, metadata={w.NAMESPACE_KEY: self.namespace})
            except w.TtrpcError as err:
                # containerd understood and refused it (bad event): retrying would not help.
                log.error("event %s refused: %s", req.envelope.topic, err)
            except OSError as err:
                delay = RETRY_DELAYS[min(self.failures, len(RETRY_DELAYS) - 1)]
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    log.warning("publishing %s failed (%s); retrying in %.1fs", req.envelope.topic, err, delay)
                if not self._scheduled:
                    self._scheduled = True
                    self.loop.call_later(delay, self.flush)
                return
            self.failures = 0
            self.queue.popleft()
            self.sent.append(req.envelope.topic)
            del self.sent[:-100]
