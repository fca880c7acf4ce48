"""Moving bytes between devices: the detailed (chunked) and analytic network models.

**Detailed** (:class:`DetailedNetwork`): every link direction is a single server with its
own queue. A message is cut into chunks of ``chunk_bytes``; a chunk holds one link
direction for ``chunk_bytes / bandwidth`` seconds and reaches the next device after the
link's latency, where it queues for the next link. Flows contend exactly where they share
a link direction, and the two directions of a link are independent. Queues are FIFO, or
ordered by message priority (lower number first, FIFO among equals) when the network is
built with ``priority=True``; a chunk on the wire is never pre-empted. On a topology
whose ``link_sharing`` is ``fair`` the flows (source and destination device) queued on
a link take turns, chunk by chunk and byte for byte, among equal priorities (start-time
fair queueing), as TCP connections through one bottleneck share it.

For FIFO links the departure of a chunk is known the moment it arrives
(``max(now, link_free_at) + service``), so each chunk costs one simulation event per hop;
a one-hop message costs one event in all. Priority links keep a heap and decide what goes
next lazily (see ``DetailedNetwork._enqueue``), also at one event per chunk and hop.

**Analytic** (:class:`AnalyticNetwork`): a message is one event, its route reserved when
it is sent, link by link, cut-through at message granularity: on each link its head
starts once it is there and the link is free, and its tail leaves ``bytes / bandwidth``
later but not before it came in over the previous link. Contention-free transfers take
exactly ``sum(latency) + bytes / min(bandwidth)``; messages sharing a link are serialised
in the order they were sent. Priority links (P3) cannot be had this way without searching
the waiting messages at every release, which costs more than the per-link queues save, so
the analytic fidelity with ``priority=True`` queues whole messages (one chunk each) per
link direction, as the detailed model does with an unbounded chunk size.

**Token buckets.** A link with a burst (``Link.burst_bytes``: an emulated cluster's ``tc
tbf``) holds each chunk to its rate's schedule less the burst: after an idle spell a
burst's worth of bytes leaves at the peak speed, a long transfer at the rate (the generic
cell rate algorithm, :meth:`LinkState.transmit`). The detailed model applies it; the
analytic model sends at the rate.

Both keep per-link counters (bytes sent, bytes received) and a record of every message,
from which the metrics are computed. A link direction's busy time is its bytes sent over
its bandwidth.

The network knows devices and links, not hosts: what a CPU host adds to a message (its
processor time, sockets, sender threads, gloo's segments) is the transport's
(:mod:`simcore.transport`), which hands the network its messages and hears back through
two hooks: :attr:`Message.on_bytes` as a message's chunks arrive, and
:attr:`Network.on_held` for the bytes a token bucket held.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from heapq import heappop, heappush
from typing import Any

from simpy import Environment, Timeout

from simcore.clock import EventQueue, FastEvent
from simcore.topology import Link, Topology

DEFAULT_CHUNK_BYTES = 1 << 20
"""Default chunk size of the detailed model (1 MiB)."""

WHOLE_MESSAGE = 1 << 62
"""A chunk size no message reaches: messages move whole."""


class LinkState:
    """Run-time state and counters of one link direction."""

    __slots__ = (
        "burst_s",
        "busy",
        "finish",
        "free_at",
        "held_bytes",
        "latency",
        "link",
        "peak_service",
        "queue",
        "rate_factor",
        "recv_bytes",
        "sent_bytes",
        "seq",
        "service",
        "tat",
        "vtime",
    )

    def __init__(self, link: Link, rate_factor: float = 1.0) -> None:
        self.link = link
        self.rate_factor = rate_factor  # this run's share of the link's rate
        self.service = 1.0 / (link.bandwidth_bytes_per_s * rate_factor)  # seconds per byte
        self.latency = link.latency
        # token bucket (a tbf-shaped link): the bucket as time at the rate, the burst's
        # speed, and the theoretical arrival time of the bytes already sent (GCRA)
        self.burst_s = link.burst_bytes * self.service
        self.peak_service = 1.0 / link.peak_bytes_per_s if link.peak_bytes_per_s > 0 else 0.0
        self.tat = 0.0
        self.held_bytes = 0.0  # bytes the bucket held to the rate (a tbf queue's)
        self.free_at = 0.0
        self.sent_bytes = 0
        self.recv_bytes = 0
        self.queue: list[tuple[float, float, int, float, Message, int, int]] = []
        self.busy = False
        self.seq = 0
        # fair sharing: the start tag of the chunk in service (virtual time) and each
        # flow's (source device, destination device) finish tag
        self.vtime = 0.0
        self.finish: dict[tuple[int, int], float] = {}

    def transmit(self, start: float, nbytes: float) -> float:
        """When ``nbytes`` put on this link at ``start`` have left it. A token bucket
        (``burst_s`` > 0) lets bytes go at the peak speed while they are within the burst
        of the rate's schedule (``tat``, the time the bytes sent so far would have taken at
        the rate), and holds the rest to the rate; a plain link sends at its rate."""
        if self.burst_s <= 0.0:
            return start + nbytes * self.service
        tat = (self.tat if self.tat > start else start) + nbytes * self.service
        self.tat = tat
        fast = start + nbytes * self.peak_service
        held = tat - self.burst_s
        if fast >= held:
            return fast
        slower = self.service - self.peak_service
        self.held_bytes += min(nbytes, (held - fast) / slower) if slower > 0 else nbytes
        return held


class ShadowLink(LinkState):
    """A private copy of a link direction for a mean-field model: traffic of one
    represented device (a server not simulated in full) queues on it without delaying the
    link's own traffic, and it waits for what its *twin* (the same link of the machine
    that is simulated in full and mirrored onto this one) has reserved: the background
    traffic the represented machine shares with its twin."""

    __slots__ = ("twin",)

    def __init__(self, link: Link, twin: LinkState) -> None:
        super().__init__(link)
        self.twin = twin


class Message:
    """A transfer of ``nbytes`` from device ``src`` to device ``dst``.

    ``on_arrival(msg)`` is called once the last byte has arrived. ``start_s`` is when the
    first byte started to move, ``end_s`` when the last byte arrived. ``rank_src`` and
    ``rank_dst`` are the ranks (or -1) the span is drawn on; ``tag`` is a short label;
    ``payload`` is the sender's own data. ``hops`` are the link directions of the route.
    ``on_bytes(nbytes)``, where set (a transport's acknowledgements), is called as each
    chunk's last byte reaches the destination, before ``on_arrival``.
    ``hold``: set by ``on_arrival`` when the receiving thread goes on working on the
    message (a parameter server's update runs on the thread that received the last push):
    it is called with a function to call once that work is done, and until then the
    receiving thread hands over no further message of this sender, nor posts the header
    receive that lets the sender go on (a transport that models the receiving threads
    reads it: :class:`simcore.transport.HostTransport`).
    """

    __slots__ = (
        "chunks_left",
        "dst",
        "end_s",
        "hold",
        "hops",
        "id",
        "iteration",
        "nbytes",
        "on_arrival",
        "on_bytes",
        "payload",
        "priority",
        "rank_dst",
        "rank_src",
        "src",
        "start_s",
        "tag",
    )

    def __init__(
        self,
        mid: int,
        src: int,
        dst: int,
        nbytes: int,
        hops: tuple[LinkState, ...],
        on_arrival: Callable[[Message], None] | None = None,
        priority: float = 0.0,
        tag: str = "",
        rank_src: int = -1,
        rank_dst: int = -1,
        iteration: int = -1,
        payload: Any = None,
    ) -> None:
        self.id, self.src, self.dst, self.nbytes, self.hops = mid, src, dst, nbytes, hops
        self.on_arrival, self.priority, self.tag = on_arrival, priority, tag
        self.start_s = -1.0
        self.end_s = -1.0
        self.chunks_left = 0
        self.rank_src, self.rank_dst, self.iteration = rank_src, rank_dst, iteration
        self.payload = payload
        self.on_bytes: Callable[[int], None] | None = None
        self.hold: Callable[[Callable[[], None]], None] | None = None

    @property
    def route(self) -> tuple[Link, ...]:
        """The links of the route, in order."""
        return tuple(st.link for st in self.hops)


class _ChunkArrival(FastEvent):
    """A chunk reaching the end of hop ``hop - 1`` of its message's route.

    A minimal event (see :mod:`simcore.clock`): chunk hops are the most frequent events
    of the detailed model, and nothing ever yields them, so they skip the general
    :class:`simpy.events.Event` machinery. On queued links one event carries a chunk
    over its whole route, scheduled again for each hop, and stands for it in a queue
    (see ``DetailedNetwork._enqueue``); ``at`` is the time it is scheduled for there.

    ``callbacks`` is the network's one list for all its chunk events: the clock swaps
    an event's list out before calling it and nothing adds to a chunk event's
    callbacks, so sharing it is safe and saves a list per chunk.
    """

    __slots__ = ("at", "hop", "msg", "size")

    def __init__(
        self, callbacks: list[Callable[[_ChunkArrival], None]], msg: Message, hop: int, size: int
    ) -> None:
        self.callbacks = callbacks
        self.msg, self.hop, self.size = msg, hop, size


class Network(ABC):
    """Common part of both models: message bookkeeping and counters."""

    fidelity = "base"

    def __init__(
        self,
        env: Environment,
        topology: Topology,
        rate_factors: Mapping[int, float] | None = None,
    ) -> None:
        self.env = env
        self.topology = topology
        factors = rate_factors or {}
        self.state = [LinkState(link, factors.get(link.index, 1.0)) for link in topology.links]
        self.messages: list[Message] = []
        self._record = self.messages.append
        self._hops: dict[tuple[int, int], tuple[LinkState, ...]] = {}
        self._next_id = 0
        self.on_held: Callable[[Message, float], None] | None = None
        """Called with a message and how many of its bytes a shaped link held to its rate
        (once per route, on its first shaped link; see :meth:`LinkState.transmit`): the
        packet work a transport charges the ends' cores. ``None``: nobody is told."""
        self._shaped = [st for st in self.state if st.burst_s > 0]

    def busy_shaped(self) -> int:
        """How many shaped link directions are busy now: what they sent is still on its
        way or their bucket is not full again (what they sent would take, at the rate,
        until less than a bucket's time ago), so a link passing on a chunk at a time
        between hops counts throughout. The analytic model keeps no bucket: there,
        what a direction has reserved counts."""
        now = self.env.now
        busy = 0
        for st in self._shaped:
            until = st.tat if st.tat > st.free_at else st.free_at
            busy += until > 0 and until + st.latency + st.burst_s > now
        return busy

    def hops(self, src: int, dst: int) -> tuple[LinkState, ...]:
        """The link directions from device ``src`` to ``dst`` (cached)."""
        key = (src, dst)
        h = self._hops.get(key)
        if h is None:
            state = self.state
            h = self._hops[key] = tuple(state[link.index] for link in self.topology.route(src, dst))
        return h

    def send(
        self,
        src: int,
        dst: int,
        nbytes: int,
        on_arrival: Callable[[Message], None] | None = None,
        priority: float = 0.0,
        tag: str = "",
        rank_src: int = -1,
        rank_dst: int = -1,
        iteration: int = -1,
        payload: Any = None,
    ) -> Message:
        """Start moving ``nbytes`` from device ``src`` to device ``dst`` now.

        Returns the :class:`Message`; ``on_arrival(msg)`` runs when its last byte has
        arrived. A message between a device and itself (or of zero bytes) arrives after
        no time. ``priority`` orders priority links' queues (lower first); ``tag``, the
        ranks (or -1), ``iteration`` and ``payload`` are kept on the message's record.
        (:meth:`message` then :meth:`start`, in one call.)
        """
        # message() and start() written out: the simulator's hot path saves two calls
        hops = self._hops.get((src, dst))
        if hops is None:
            hops = self.hops(src, dst)
        msg = Message(
            self._next_id,
            src,
            dst,
            nbytes,
            hops,
            on_arrival,
            priority,
            tag,
            rank_src,
            rank_dst,
            iteration,
            payload,
        )
        self._next_id += 1
        self._record(msg)
        if not hops or nbytes <= 0:
            self._arrive_now(msg)
            return msg
        self._inject(msg)
        return msg

    def message(self, src: int, dst: int, nbytes: int, *args: Any, **kwargs: Any) -> Message:
        """The message :meth:`send` would send now with the same arguments, recorded (its
        id and its place among the records are now's) but not moving yet: :meth:`start`
        puts it on its way, now or later (a transport's message may wait for its
        sender's CPU first)."""
        msg = Message(self._next_id, src, dst, nbytes, self.hops(src, dst), *args, **kwargs)
        self._next_id += 1
        self._record(msg)
        return msg

    def start(self, msg: Message) -> None:
        """Start moving ``msg`` (from :meth:`message`) now."""
        if not msg.hops or msg.nbytes <= 0:
            self._arrive_now(msg)
            return
        self._inject(msg)

    def _arrive_now(self, msg: Message) -> None:
        msg.start_s = self.env.now
        ev = Timeout(self.env, 0, msg)
        ev.callbacks.append(self._deliver_local)

    def _deliver_local(self, ev: Any) -> None:
        msg: Message = ev.value
        msg.end_s = self.env.now
        if msg.on_arrival is not None:
            msg.on_arrival(msg)

    def _complete(self, msg: Message) -> None:
        msg.end_s = self.env.now
        if msg.on_arrival is not None:
            msg.on_arrival(msg)

    @abstractmethod
    def _inject(self, msg: Message) -> None:
        """Put a routed, non-empty message on its first link."""

    # ---- counters --------------------------------------------------------------------
    def copy_counters(self, pairs: list[tuple[int, int]]) -> None:
        """Give link ``a`` the byte counters of link ``b`` for every ``(a, b)`` of
        ``pairs`` (link indices): how a run that simulates some boxes of a symmetric
        cluster accounts for the others' traffic."""
        state = self.state
        for a, b in pairs:
            state[a].sent_bytes = state[b].sent_bytes
            state[a].recv_bytes = state[b].recv_bytes

    def link_bytes(self) -> list[tuple[Link, int, int, float]]:
        """``(link, sent_bytes, received_bytes, busy_s)`` for every link direction."""
        return [(s.link, s.sent_bytes, s.recv_bytes, s.sent_bytes * s.service) for s in self.state]


class DetailedNetwork(Network):
    """Chunked store-and-forward model with per-direction queues (see module docs)."""

    fidelity = "detailed"

    def __init__(
        self,
        env: Environment,
        topology: Topology,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        priority: bool = False,
        rate_factors: Mapping[int, float] | None = None,
    ) -> None:
        super().__init__(env, topology, rate_factors)
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
        self.chunk_bytes = int(chunk_bytes)
        self.priority = priority
        self.fair = topology.link_sharing == "fair"
        self.lead_s = topology.link_lead_s
        self._queued = priority or self.fair
        queue = EventQueue(env)
        self._at = queue.at
        # _serve's push: unchecked where no link's latency is negative (see there)
        self._push = queue.push if all(st.latency >= 0 for st in self.state) else queue.at
        # One callbacks list for all chunk events of each kind (see _ChunkArrival)
        self._fifo_callbacks = [self._arrive_fifo]
        self._prio_callbacks = [self._arrive_prio]

    def _inject(self, msg: Message) -> None:
        n = msg.nbytes
        c = self.chunk_bytes
        now = self.env.now
        if self._queued:
            cb = self._prio_callbacks
            if n <= c:  # one chunk (most messages): what the loops below do for it
                msg.chunks_left = 1
                self._enqueue(_ChunkArrival(cb, msg, 0, n), now)
                return
            full, last = divmod(n, c)
            msg.chunks_left = full + (1 if last else 0)
            for _ in range(full):
                self._enqueue(_ChunkArrival(cb, msg, 0, c), now)
            if last:
                self._enqueue(_ChunkArrival(cb, msg, 0, last), now)
            return
        # FIFO: the first hop's departures are known now.
        st = msg.hops[0]
        t = st.free_at
        if t < now:
            t = now
        msg.start_s = t
        st.sent_bytes += n
        at = self._at
        cb = self._fifo_callbacks
        if len(msg.hops) == 1:
            # One hop: only the arrival of the last byte matters.
            msg.chunks_left = 1
            end = self._transmit(st, msg, 0, t, n)
            st.free_at = end
            at(end + st.latency, _ChunkArrival(cb, msg, 1, n))
            return
        full, last = divmod(n, c)
        msg.chunks_left = full + (1 if last else 0)
        lat = st.latency
        h0 = st.held_bytes
        for _ in range(full):
            t = st.transmit(t, c)
            at(t + lat, _ChunkArrival(cb, msg, 1, c))
        if last:
            t = st.transmit(t, last)
            at(t + lat, _ChunkArrival(cb, msg, 1, last))
        st.free_at = t
        self._held(msg, 0, st.held_bytes - h0)

    def _transmit(self, st: LinkState, msg: Message, hop: int, start: float, size: int) -> float:
        """``st.transmit`` of ``size`` bytes of ``msg`` (its hop ``hop``) from ``start``,
        the bytes the bucket held charged to the ends (:meth:`_held`); returns the end."""
        before = st.held_bytes
        end = st.transmit(start, size)
        self._held(msg, hop, st.held_bytes - before)
        return end

    def _held(self, msg: Message, hop: int, by_bucket: float) -> None:
        """Tell :attr:`on_held` of ``by_bucket`` bytes of ``msg`` that a shaped link (hop
        ``hop``) held to its rate (a transport charges the ends' cores for them), once per
        route: on its first shaped link. The bytes reach a later one at the rate already
        (a chunk stored and forwarded whole would look held again); where many senders
        meet at a receiver's link, TCP slows them to their share there, so their bytes
        are held about once too, if not always on the first link."""
        if by_bucket <= 0 or self.on_held is None:
            return
        if all(h.burst_s <= 0 for h in msg.hops[:hop]):
            self.on_held(msg, by_bucket)

    def _arrive_fifo(self, ev: _ChunkArrival) -> None:
        msg = ev.msg
        hop = ev.hop
        size = ev.size
        hops = msg.hops
        hops[hop - 1].recv_bytes += size
        if hop == len(hops):
            if msg.on_bytes is not None:
                msg.on_bytes(size)
            msg.chunks_left -= 1
            if msg.chunks_left == 0:
                self._complete(msg)
            return
        st = hops[hop]
        now = self.env.now
        start = st.free_at
        if start < now:
            start = now
        if st.burst_s <= 0.0:  # a plain link: nothing held, no bucket to update
            end = start + size * st.service
        else:
            end = self._transmit(st, msg, hop, start, size)
        st.free_at = end
        st.sent_bytes += size
        self._at(end + st.latency, _ChunkArrival(self._fifo_callbacks, msg, hop + 1, size))

    # ---- queued links: priorities, fair sharing ---------------------------------------
    # A chunk that finds its link idle (free, nobody queued) is served at once. Otherwise
    # it queues with its arrival time, and the choice of what the link serves next at
    # ``free_at`` is made lazily by the arrival event of the chunk that was on the wire
    # (``free_at + latency``): among the chunks that had queued by ``free_at``, the best
    # goes: lowest priority number, then (fair sharing) lowest start tag, then first
    # come. Later chunks cannot jump into a service that had started before they came,
    # and every chunk and hop costs exactly one event.
    #
    # A chunk has one event for its whole route (its injection makes it): the event of
    # its arrival at a link is what waits in that link's queue, and serving the chunk
    # schedules the same event again, ``hop`` one on, for the end of the link. Nothing
    # else holds chunk events (nobody yields them) and the clock is done with an event
    # once its callback has run, so scheduling it again is safe; it saves an object
    # per chunk and hop.
    #
    # Fair sharing is start-time fair queueing over flows (a source and a destination
    # device: one TCP connection): a chunk's start tag is the larger of the link's
    # virtual time (the tag of the chunk in service) and its flow's last finish tag,
    # and its finish tag that plus its bytes. Flows that queue together take turns
    # chunk by chunk, byte for byte, as TCP connections through one bottleneck do,
    # instead of each message waiting for every byte queued before it. A flow that starts
    # (its last finish tag is behind the virtual time) starts ``lead_s`` of the link's
    # bytes later: the connections already sending have that much in flight ahead of it.
    def _tag(self, st: LinkState, msg: Message, size: int, idle: bool) -> float:
        finish = st.finish
        if idle and finish:  # a new busy period: nobody is owed service
            st.vtime = max(st.vtime, max(finish.values()))
        flow = (msg.src, msg.dst)
        last = finish.get(flow, 0.0)
        vtime = st.vtime
        start = last if last > vtime else vtime + self.lead_s / st.service
        finish[flow] = start + size
        return start

    def _enqueue(self, ev: _ChunkArrival, now: float) -> None:
        """Chunk ``ev`` (its message's chunk of ``ev.size`` bytes) comes to hop
        ``ev.hop`` of its route at ``now`` (the clock's time): served at once if the link
        is idle, else queued."""
        msg = ev.msg
        st = msg.hops[ev.hop]
        idle = st.free_at <= now and not st.queue
        tag = self._tag(st, msg, ev.size, idle) if self.fair else 0.0
        if idle:
            st.vtime = tag
            self._serve(st, ev, now)
            return
        st.seq += 1
        heappush(st.queue, (msg.priority, tag, st.seq, now, ev))

    def _serve(self, st: LinkState, ev: _ChunkArrival, start: float) -> None:
        """Put chunk ``ev`` on link ``st`` (its hop ``ev.hop``) at ``start``; ``ev`` fires
        again at the end of the link, for the next hop."""
        msg = ev.msg
        hop = ev.hop
        size = ev.size
        if msg.start_s < 0:
            msg.start_s = start
        st.sent_bytes += size
        if st.burst_s <= 0.0:  # a plain link: nothing held, no bucket to update
            end = start + size * st.service
        else:
            end = self._transmit(st, msg, hop, start, size)
        st.free_at = end
        ev.hop = hop + 1
        ev.callbacks = self._prio_callbacks
        # Pushed without the clock's past-time check, which never fails here: ``start``
        # is now, a chunk's arrival (by now) or when the link came free, which is at
        # least when the chunk that just crossed it left (``now - latency``, what
        # _advance is called on); the end is not before ``start``, and the latency not
        # negative (a topology with one that is keeps the check, and its ValueError).
        at = ev.at = end + st.latency
        self._push(at, ev)

    def _advance(self, st: LinkState, now: float) -> None:
        """Start, on free link ``st``, every service that begins by ``now``: each one takes
        the best chunk that had queued by its start (the link idles until the next chunk
        came if none had)."""
        queue = st.queue
        while queue and st.free_at <= now:
            start = st.free_at
            if queue[0][3] <= start:
                # The best chunk had queued by the start (the usual case): nothing to set
                # aside and put back, as below.
                _, tag, _, _, ev = heappop(queue)
                st.vtime = tag
                self._serve(st, ev, start)
                continue
            later = []
            while queue and queue[0][3] > start:
                later.append(heappop(queue))
            if queue:
                _, tag, _, _, ev = heappop(queue)
            else:  # the link went idle until the first of the later chunks came
                first = min(later, key=lambda e: (e[3], e[2]))
                later.remove(first)
                _, tag, _, start, ev = first
            for entry in later:
                heappush(queue, entry)
            st.vtime = tag
            self._serve(st, ev, start)

    def _arrive_prio(self, ev: _ChunkArrival) -> None:
        msg = ev.msg
        hop = ev.hop
        size = ev.size
        hops = msg.hops
        prev = hops[hop - 1]
        prev.recv_bytes += size
        now = ev.at  # the clock's time: this event fires when it was scheduled for
        if prev.queue and prev.free_at <= now:
            self._advance(prev, now)
        if hop == len(hops):
            if msg.on_bytes is not None:
                msg.on_bytes(size)
            msg.chunks_left -= 1
            if msg.chunks_left == 0:  # _complete, written out
                msg.end_s = now
                if msg.on_arrival is not None:
                    msg.on_arrival(msg)
            return
        st = hops[hop]
        if self.fair or st.queue or st.free_at > now:
            self._enqueue(ev, now)
            return
        # Fast path, the most frequent event of a priority network: the next link is
        # idle and nobody queues for it, so the chunk goes on at once, as _enqueue would
        # serve it (without fair sharing there is no start tag and the virtual time
        # stays 0).
        self._serve(st, ev, now)


def reserve_cut_through(
    hops: Sequence[LinkState], nbytes: int, start: float
) -> tuple[float, float]:
    """Reserve ``nbytes`` sent at ``start`` over the link directions ``hops`` (non-empty),
    cut-through at message granularity; returns ``(when its head started on the first
    link, when its tail arrived)``.

    On each link the head starts once it has reached the link and the link is free; the
    tail leaves ``bytes / bandwidth`` later, but not before it has come in over the
    previous link. Each link's ``free_at`` moves to when the tail has left it and its
    ``sent_bytes`` grows. Without contention the arrival is exactly ``sum(latency) +
    bytes / min(bandwidth)``. The analytic network reserves every message this way, and
    :mod:`simcore.collectives` walks a collective's sends this way over scratch states."""
    head = start
    tail = 0.0
    first = -1.0
    for st in hops:
        if st.free_at > head:
            head = st.free_at
        if first < 0:
            first = head
        leave = head + nbytes * st.service
        if leave < tail:
            leave = tail
        st.free_at = leave
        st.sent_bytes += nbytes
        head += st.latency
        tail = leave + st.latency
    return first, tail


class AnalyticNetwork(Network):
    """One event per message; its route is reserved link by link when it is sent (see
    module docs)."""

    fidelity = "analytic"

    def post(
        self,
        src: int,
        dst: int,
        nbytes: int,
        tag: str = "",
        rank_src: int = -1,
        rank_dst: int = -1,
        iteration: int = -1,
        payload: Any = None,
    ) -> Message:
        """Send like :meth:`send`, without an arrival callback and without an event: a
        message's arrival is known when it is sent (routes are reserved in the order
        messages are sent), so it is returned in ``msg.end_s`` and its bytes are counted
        as received at once. A scheme that can react to an arrival time instead of an
        arrival event saves one event per message."""
        msg = Message(
            self._next_id,
            src,
            dst,
            nbytes,
            self.hops(src, dst),
            None,
            0.0,
            tag,
            rank_src,
            rank_dst,
            iteration,
            payload,
        )
        self._next_id += 1
        self._record(msg)
        msg.end_s = self._reserve(msg, self.env.now)
        if nbytes > 0:
            for st in msg.hops:
                st.recv_bytes += nbytes
        return msg

    def _reserve(self, msg: Message, start: float) -> float:
        """Reserve ``msg``'s route hop by hop, cut-through at message granularity, in the
        order messages are sent; returns its arrival time.

        On each link the message's head starts once it has reached the link and the link
        is free; its tail leaves ``bytes / bandwidth`` later, but not before the tail has
        come in over the previous link. Without contention this is exactly
        ``sum(latency) + bytes / min(bandwidth)``; a busy link delays the message from
        that hop on, without holding the other links idle."""
        hops = msg.hops
        nbytes = msg.nbytes
        if not hops or nbytes <= 0:
            msg.start_s = start
            return start
        msg.start_s, end = reserve_cut_through(hops, nbytes, start)
        return end

    def _inject(self, msg: Message) -> None:
        now = self.env.now
        ev = Timeout(self.env, self._reserve(msg, now) - now, msg)
        ev.callbacks.append(self._arrive)

    # ---- grouped messages (mean-field models) ------------------------------------------
    def send_grouped(
        self,
        src: int,
        dst: int,
        nbytes: int,
        hops: tuple[LinkState, ...],
        weights: tuple[float, ...],
        on_arrival: Callable[[Message], None],
        tag: str = "",
        rank_src: int = -1,
        rank_dst: int = -1,
        iteration: int = -1,
        payload: Any = None,
    ) -> Message:
        """Send a *group* of identical messages sent at once: ``weights[i]`` of them cross
        hop ``i`` (of ``hops``, which may include :class:`ShadowLink` copies of links), so
        hop ``i`` carries ``nbytes * weights[i]`` bytes. ``on_arrival`` runs when the last
        of the group has arrived (the group is served back to back in FIFO order, as
        identical messages sent at the same moment would be). A model that simulates one
        representative of many identical flows uses it."""
        msg = Message(
            self._next_id,
            src,
            dst,
            nbytes,
            hops,
            on_arrival,
            0.0,
            tag,
            rank_src,
            rank_dst,
            iteration,
            (payload, weights),
        )
        self._next_id += 1
        self._record(msg)
        now = self.env.now
        end = self._reserve_grouped(msg, now, weights) if hops and nbytes > 0 else now
        if not hops or nbytes <= 0:
            msg.start_s = now
        ev = Timeout(self.env, end - now, msg)
        ev.callbacks.append(self._arrive_grouped)
        return msg

    def _reserve_grouped(self, msg: Message, start: float, weights: tuple[float, ...]) -> float:
        """:meth:`_reserve` with ``weights[i]`` messages on hop ``i``; a shadow link also
        waits for what its twin has reserved (its background traffic)."""
        nbytes = msg.nbytes
        head = start
        tail = 0.0
        first = True
        for st, w in zip(msg.hops, weights, strict=True):
            free = st.free_at
            if type(st) is ShadowLink and st.twin.free_at > free:
                free = st.twin.free_at
            if free > head:
                head = free
            if first:
                msg.start_s = head
                first = False
            nb = nbytes * w
            leave = head + nb * st.service
            if leave < tail:
                leave = tail
            st.free_at = leave
            st.sent_bytes += round(nb)
            head += st.latency
            tail = leave + st.latency
        return tail

    def _arrive_grouped(self, ev: Any) -> None:
        msg: Message = ev.value
        payload, weights = msg.payload
        msg.payload = payload
        for st, w in zip(msg.hops, weights, strict=True):
            st.recv_bytes += round(msg.nbytes * w)
        if msg.on_bytes is not None:
            msg.on_bytes(msg.nbytes)
        self._complete(msg)

    def _arrive(self, ev: Any) -> None:
        msg: Message = ev.value
        for st in msg.hops:
            st.recv_bytes += msg.nbytes
        if self.on_held is not None and any(st.burst_s > 0 for st in msg.hops):
            self.on_held(msg, msg.nbytes)  # no bucket: all held
        if msg.on_bytes is not None:
            msg.on_bytes(msg.nbytes)
        self._complete(msg)


def uplink_factors(topology: Topology, seed: int) -> dict[int, float]:
    """Each fabric uplink's share of its rate in one run (link index -> factor), from the
    topology's concurrent-flow measurements: ``flow_share`` times a log-normal factor of
    mean 1 and coefficient of variation ``flow_spread``, drawn from ``seed``, and at most
    1 (no flow beats a lone one: the link's rate is what a lone flow gets). An uplink is
    a link direction into a switch (a NIC's or a server's); the downlinks keep their
    rate, so a flow's rate is its sender's draw. Empty when the topology has neither,
    and on CPU hosts, whose ranks, messaging and links' packet work share the machine's
    cores as the host model charges them: the concurrent-flows benchmark's shortfall is
    that same work there, and counting it twice made the CPU cluster's slow links 20-30%
    slower than measured (docs/prediction.md)."""
    if topology.host_spec is not None and topology.gpu_spec.kind == "cpu":
        return {}
    share, cv = topology.flow_share, topology.flow_spread
    devices = topology.devices
    ups = [
        link.index
        for link in topology.links
        if devices[link.dst].kind == "switch" and devices[link.src].kind != "switch"
    ]
    if not ups or (share == 1.0 and cv == 0.0):
        return {}
    if cv == 0.0:
        return dict.fromkeys(ups, share)
    import numpy as np  # only runs with a spread pay for the import

    sigma = math.sqrt(math.log1p(cv * cv))
    draws = np.random.default_rng([seed, 1]).lognormal(-0.5 * sigma * sigma, sigma, len(ups))
    return {i: min(1.0, share * float(f)) for i, f in zip(ups, draws, strict=True)}


def make_network(
    env: Environment,
    topology: Topology,
    fidelity: str,
    chunk_bytes: int,
    priority: bool = False,
    rate_factors: Mapping[int, float] | None = None,
) -> Network:
    """The network model for ``fidelity`` (``detailed`` or ``analytic``), with priority
    link queues if ``priority``; ``rate_factors`` (link index -> factor) scales the rates
    of the links named (:func:`uplink_factors`)."""
    if fidelity == "detailed":
        return DetailedNetwork(
            env, topology, chunk_bytes=chunk_bytes, priority=priority, rate_factors=rate_factors
        )
    if fidelity == "analytic":
        if priority:
            # Whole messages in per-link priority queues (see module docs).
            return DetailedNetwork(
                env, topology, chunk_bytes=WHOLE_MESSAGE, priority=True, rate_factors=rate_factors
            )
        return AnalyticNetwork(env, topology, rate_factors)
    raise ValueError(f"unknown fidelity {fidelity!r}; choose detailed or analytic")
