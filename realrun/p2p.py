"""Point-to-point messages whose receives are posted ahead: no Python thread on the path.

A scheme whose every message is known in advance (a pipeline's schedule names each
activation and gradient, its sender and the action that consumes it; gossip's partner
schedule names each gradient and batch) does not need the
:class:`~realrun.runtime.Messenger`'s sender and receiver threads. :class:`PostedLink`
posts gloo's ``irecv`` for the next expected messages into their own buffers and sends
with ``isend``; gloo's transport thread moves the bytes in C++ while the rank computes,
so a message never waits for a Python thread to get a core and the interpreter lock.
Waiting for a message is ``work.wait()`` on the main thread. Posting ahead also keeps the
wire full duplex: gloo sends a message only after the receiver's ready notice, which
travels in the same TCP stream as the data going the other way, so two ranks that
exchange on demand often take turns.

Each message carries a gloo tag made of its kind and key (unique among the messages in
flight between two ranks), so receives match their sends whatever the order of arrival.
No header travels: the receiver knows each message's shape from the schedule.

gloo marks a send complete only when it is waited for, and a send cannot complete before
the receiver has posted its receive. The rank never waits for its own sends, as a GPU
host's framework does not (nor do the simulator's ranks): a completer thread of the link
waits for them in the order they were posted, keeping each tensor until then, and
:meth:`PostedLink.close` waits for the completer. That thread sleeps in gloo's wait,
without the interpreter lock, and wakes once a send. Timeline: a send span is the time the
rank takes to hand the message to gloo; a receive span runs from when the rank starts
waiting for the message until it is there (a message already there gets a short one).
"""

from __future__ import annotations

import datetime
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from realrun import emudevice
from realrun.runtime import KIND_NAMES, TAG_SPACE, Recorder
from simcore.records import RECV, SEND

Expected = tuple[int, int, int, int, torch.Tensor]
"""``(src, kind, key, iteration, buffer)`` of a message a rank will receive."""


def message_tag(kind: int, key: int) -> int:
    """The gloo tag of message ``(kind, key)``."""
    return (key * 16 + kind) % TAG_SPACE


class PostedLink:
    """Sends with ``isend`` and receives into receives posted ahead (see module docs).

    ``expected`` yields the messages this rank will receive, in the order it consumes
    them; up to ``window`` of them have a receive posted at any time, or, with ``window``
    None, those of the iterations up to the one :meth:`post_through` last named (a scheme
    that posts an iteration's receives together). ``label(kind, key)`` names a message and
    its trace layer for the timeline.
    """

    def __init__(
        self,
        rank: int,
        world: int,
        group: Any,
        rec: Recorder,
        expected: Iterable[Expected],
        window: int | None,
        label: Callable[[int, int], tuple[str, int]],
        timeout_s: float,
    ) -> None:
        self.rank, self.world, self.group, self.rec = rank, world, group, rec
        self.label = label
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._expected = iter(expected)
        self._window = None if window is None else max(1, window)
        self._through = -1  # window None: iterations posted so far
        self._ahead: Expected | None = None  # the next expected message, not yet posted
        self._posted: dict[tuple[int, int], tuple[Any, torch.Tensor, int, int]] = {}
        self._sends: queue.SimpleQueue[tuple[Any, torch.Tensor] | None] = queue.SimpleQueue()
        self._completer: threading.Thread | None = None
        self._send_error: BaseException | None = None
        self._post_more()

    # ---- receiving -------------------------------------------------------------------
    def _peek(self) -> Expected | None:
        """The next expected message not yet posted (None after the last)."""
        if self._ahead is None:
            self._ahead = next(self._expected, None)
        return self._ahead

    def _post_more(self) -> None:
        while (nxt := self._peek()) is not None:
            if self._window is None:
                if nxt[3] > self._through:
                    return
            elif len(self._posted) >= self._window:
                return
            self._ahead = None
            src, kind, key, it, buf = nxt
            work = dist.irecv(buf, src, group=self.group, tag=message_tag(kind, key))
            self._posted[(kind, key)] = (work, buf, src, it)

    def post_through(self, iteration: int) -> None:
        """Post the receives of every expected message of iterations up to ``iteration``
        (a link made with ``window`` None posts nothing else)."""
        self._through = max(self._through, iteration)
        self._post_more()

    def wait(self, kind: int, key: int) -> torch.Tensor:
        """Wait for message ``(kind, key)`` and return its buffer (it must be among the
        posted ones: consume messages in the order ``expected`` gave them)."""
        entry = self._posted.pop((kind, key), None)
        if entry is None:
            raise RuntimeError(
                f"rank {self.rank} waits for message kind {KIND_NAMES.get(kind, kind)} "
                f"key {key}, which no posted receive expects"
            )
        work, buf, src, it = entry
        start = self.rec.now()
        work.wait(self.timeout)
        end = self.rec.now()
        name, layer = self.label(kind, key)
        nbytes = buf.numel() * buf.element_size()
        self.rec.span(
            RECV, "recv", name, start, end, it, layer, nbytes,
            self._flow(src, self.rank, kind, key),
        )  # fmt: skip
        self._post_more()
        return buf

    # ---- sending ---------------------------------------------------------------------
    def send(self, dst: int, kind: int, key: int, iteration: int, payload: torch.Tensor) -> None:
        """Post ``payload`` to rank ``dst`` (it must stay unchanged until sent: the link
        keeps a reference until its completer has waited for the send; an emulated
        device's queued work ends first, as a GPU's kernels end before their output is
        sent)."""
        self._raise_send_error()
        emudevice.sync()
        payload = payload.contiguous()
        start = self.rec.now()
        work = dist.isend(payload, dst, group=self.group, tag=message_tag(kind, key))
        end = self.rec.now()
        nbytes = payload.numel() * payload.element_size()
        self.rec.count_sent(dst, iteration, nbytes, KIND_NAMES[kind])
        name, layer = self.label(kind, key)
        self.rec.span(
            SEND, "send", name, start, end, iteration, layer, nbytes,
            self._flow(self.rank, dst, kind, key),
        )  # fmt: skip
        if self._completer is None:
            self._completer = threading.Thread(
                target=self._complete_sends, name=f"rank{self.rank}-sends", daemon=True
            )
            self._completer.start()
        self._sends.put((work, payload))

    def _complete_sends(self) -> None:
        """The completer thread: wait for each send in order until ``None`` comes; the
        first failure is kept for the rank's thread to raise."""
        while (item := self._sends.get()) is not None:
            if self._send_error is None:
                try:
                    item[0].wait(self.timeout)
                except Exception as exc:  # raised on the rank's thread
                    self._send_error = exc

    def _raise_send_error(self) -> None:
        if self._send_error is not None:
            raise RuntimeError(
                f"rank {self.rank}: a send did not complete: {self._send_error}"
            ) from self._send_error

    def close(self, drain: bool = False) -> None:
        """Wait for every send to complete. Every expected message must have been
        consumed, unless ``drain``: then the ones left are received and dropped (a
        message the scheme sends but never uses, such as gossip's batch for the iteration
        after the last)."""
        if drain:  # the peers' sends are posted: these complete without their threads
            self._through = 1 << 62
            self._post_more()
            while self._posted:
                for work, *_rest in list(self._posted.values()):
                    work.wait(self.timeout)
                self._posted.clear()
                self._post_more()
        if self._completer is not None:
            self._sends.put(None)
            self._completer.join()
            self._completer = None
        self._raise_send_error()
        if self._posted or self._peek() is not None:
            raise RuntimeError(f"rank {self.rank} finished with messages it never consumed")

    def _flow(self, src: int, dst: int, kind: int, key: int) -> int:
        return ((src * self.world + dst) << 32) | message_tag(kind, key)
