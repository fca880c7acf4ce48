"""Between the schemes and the network: what the hosts add to a message.

The layers are ASTRA-sim's: the workload (a scheme's processes) says what moves and
when; the system (:mod:`simcore.collectives`, and this transport) turns that into
messages and adds what the hosts' software costs them; the network
(:mod:`simcore.network`) moves bytes over links and knows nothing of hosts.

A scheme or a collective sends through a transport and says how the real runtime moves
the message, never what that costs:

* :attr:`Transport.send`: a message a rank's messenger thread hands over one at a time,
  with a blocking send whose receiver posts a header receive for it (a parameter
  server's pushes, pulls and values; ``realrun.runtime.Messenger``);
* :attr:`Transport.isend`: an ``isend`` whose receive is posted ahead
  (``realrun.p2p``), written by a communication thread of the runtime (gloo's);
* :attr:`Transport.isend_on_thread`: such an ``isend`` written by the sending rank's
  own thread (a pipeline's activations and gradients; gloo writes in the caller when the
  receive is posted);
* :meth:`Transport.collective_sender`: a collective's messages, each travelling as
  ``segments`` messages of the library (:meth:`Transport.ring_segments`) and summed
  into the receiver's buffer where ``reduces``.

Each is a function with :meth:`Network.send <simcore.network.Network.send>`'s signature
that returns the :class:`~simcore.network.Message`.

:class:`Transport` is the null transport of GPU clusters: a message costs the hosts
nothing, every send is the network's own (the very same function: the send path is the
simulator's hot path), collectives may be computed in closed form in the analytic
fidelity, and a scheme may post messages whose arrival the network knows when they are
sent (:attr:`Transport.post`).

:class:`HostTransport` is the transport of CPU hosts (a topology with a ``host``
section: the emulated cluster, a calibrated file, emulated GPU hosts). A message's ends
cost CPU on their machines' shared cores (:class:`CommCpu`: per message, per byte, a
reduction's sums, a messenger's own code) and it is delivered once the wire and both
ends are done and the receiving thread has had a core; a messenger hands its messages
over one at a time through one TCP connection per destination, each held for a
handshake and the socket's send buffer (:class:`_Sender`, :class:`_Socket`); an
``isend`` the rank's own thread writes holds that thread meanwhile; and the bytes a
shaped link holds to its rate cost the ends' cores the kernel's packet work
(:attr:`Network.on_held <simcore.network.Network.on_held>`). Every message runs as
messages there, collectives included, since their CPU competes with the ranks' compute.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import Any

from simpy import Timeout

from simcore.host import CpuPool
from simcore.network import AnalyticNetwork, Message, Network
from simcore.topology import HostSpec

SendFn = Callable[..., Message]
"""A send: :meth:`simcore.network.Network.send`'s arguments, from ``src``, ``dst`` and
``nbytes`` to ``payload``; returns the message."""


class Transport:
    """The null transport (GPU clusters): messages go straight to the network, at no
    cost to the hosts (see module docs).

    Attributes:
        net: the network model.
        send: a messenger's blocking send (here the network's own send).
        isend: an ``isend`` to a posted receive (here the network's own send).
        isend_on_thread: an ``isend`` the sending rank's thread writes (here the
            network's own send).
        post: :meth:`AnalyticNetwork.post <simcore.network.AnalyticNetwork.post>` where
            the network knows a message's arrival when it is sent and nothing delays it
            beyond the wire, else ``None``.
        closed_form: whether collectives may be computed in closed form (the analytic
            network, nothing beyond the wire) instead of as their messages.
        collective_threads: collectives that can be in flight at once: one stream on
            GPUs; gloo's worker threads where the topology has a ``gloo`` section.
    """

    def __init__(self, net: Network) -> None:
        self.net = net
        self.send: SendFn = net.send
        self.isend: SendFn = net.send
        self.isend_on_thread: SendFn = net.send
        self.post: SendFn | None = net.post if isinstance(net, AnalyticNetwork) else None
        gloo = net.topology.gloo
        self.collective_threads = gloo.threads if gloo is not None else 1

    @property
    def closed_form(self) -> bool:
        """Whether collectives may be closed forms: where messages may be posted."""
        return self.post is not None

    def collective_sender(self, segments: int = 1, reduces: bool = False) -> SendFn:
        """The send of a collective's messages that each travel as ``segments`` messages
        of the library and, with ``reduces``, are summed into the receiver's buffer on
        arrival; here the network's own send."""
        return self.net.send

    def ring_segments(self, nbytes: int, ranks: int) -> int:
        """Library messages each send of a ring over ``ranks`` ranks moving ``nbytes``
        travels as: one here."""
        return 1

    def send_grouped(self, *args: Any, **kwargs: Any) -> Message:
        """A group of identical messages on the analytic network (a mean-field model's):
        :meth:`AnalyticNetwork.send_grouped
        <simcore.network.AnalyticNetwork.send_grouped>`'s arguments."""
        net = self.net
        assert isinstance(net, AnalyticNetwork), "grouped messages need the analytic network"
        return net.send_grouped(*args, **kwargs)


class HostTransport(Transport):
    """The transport of CPU hosts (see module docs): every message costs its ends the
    CPU of ``cpu`` (:class:`CommCpu`), and the network tells it of the bytes its shaped
    links hold (it takes the network's :attr:`~simcore.network.Network.on_held`)."""

    def __init__(self, net: Network, cpu: CommCpu) -> None:
        super().__init__(net)
        self.cpu = cpu
        self.post = None  # a message's arrival waits for the hosts' CPU too
        self._senders: dict[int, _Sender] = {}
        """Each sending device's messenger thread, once it has sent."""
        self._collective: dict[tuple[int, bool], SendFn] = {}
        self.send = self._sender(True, False, 1, False)
        self.isend = self._sender(False, False, 1, False)
        self.isend_on_thread = self._sender(False, True, 1, False)
        net.on_held = self._held

    def collective_sender(self, segments: int = 1, reduces: bool = False) -> SendFn:
        key = (segments, reduces)
        fn = self._collective.get(key)
        if fn is None:
            fn = self._collective[key] = self._sender(False, False, segments, reduces)
        return fn

    def ring_segments(self, nbytes: int, ranks: int) -> int:
        """Messages each send of a ring travels as: gloo cuts the ring's buffer into
        :meth:`GlooSpec.segments <simcore.topology.GlooSpec.segments>`, a multiple of
        the ranks (one without a ``gloo`` section)."""
        gloo = self.net.topology.gloo
        return gloo.segments(nbytes, ranks) // ranks if gloo is not None else 1

    def send_grouped(self, *args: Any, **kwargs: Any) -> Message:
        raise ValueError(
            "grouped messages (a mean-field model) are not modelled on CPU hosts, whose "
            "workers share cores and cannot stand for each other"
        )

    def _sender(self, p2p: bool, on_thread: bool, segments: int, reduces: bool) -> SendFn:
        """The send, with :meth:`Network.send`'s signature, of messages of one kind: each
        travels as ``segments`` messages of the transport and, with ``reduces``, its
        receiver adds it into a buffer of its own. A message between a device and itself
        (or of no bytes) costs no CPU and arrives after no time. ``p2p``: a messenger's
        (a parameter server's, not a collective's, a pipeline's or a gossip exchange's,
        whose receives are posted ahead), which costs the messenger's own code at both
        ends too and, with a handshake, waits for the device's sender (:class:`_Sender`).
        ``on_thread``: the sending rank's own thread writes it, so the sending end's CPU
        work holds that rank (:meth:`CommCpu.join`); on a device host (no rank thread on
        the cores) a communication thread writes it and the rank goes on at once
        (``isend`` returns before the bytes have left; measured,
        docs/emulated_devices.md). Any other message's writing thread waits for a core
        first (:meth:`CommCpu.wake`)."""
        net, cpu, senders = self.net, self.cpu, self._senders
        spec = cpu.spec
        handshake_s = spec.p2p_handshake_s if p2p else 0.0
        message, start = net.message, self._start

        def send(src: int, dst: int, nbytes: int, *args: Any, **kwargs: Any) -> Message:
            msg = message(src, dst, nbytes, *args, **kwargs)  # Network.send's arguments
            if not msg.hops or nbytes <= 0:  # nothing crosses a link
                net.start(msg)
                return msg
            reduce_bytes = nbytes if reduces else 0
            if handshake_s > 0:
                sender = senders.get(src)
                if sender is None:
                    sender = senders[src] = _Sender(self, handshake_s, spec.socket_buffer_bytes)
                sender.queue(msg, segments, reduce_bytes, p2p)
            elif on_thread and src in cpu.thread_of:  # the rank's thread: running
                start(msg, segments, reduce_bytes, p2p, True)
            else:  # the thread that writes the bytes waits for a core first
                cpu.wake(src, lambda: start(msg, segments, reduce_bytes, p2p))
            return msg

        return send

    def _start(
        self,
        msg: Message,
        segments: int,
        reduce_bytes: int,
        p2p: bool,
        on_thread: bool = False,
    ) -> None:
        """Put ``msg`` on the wire with its ends' CPU work."""
        self._join(msg, segments, reduce_bytes, p2p, on_thread)
        self.net.start(msg)

    def _join(
        self,
        msg: Message,
        segments: int,
        reduce_bytes: int,
        p2p: bool = False,
        on_thread: bool = False,
    ) -> None:
        """Deliver ``msg`` only when the wire and both ends' CPU work are done (with
        ``p2p`` each end's with a messenger thread's own code too), and the receiving
        thread has had a core (:meth:`CommCpu.wake`)."""
        cpu = self.cpu
        env = self.net.env
        deliver = msg.on_arrival
        left, start = cpu.join(msg.src, msg.dst, msg.nbytes, segments, reduce_bytes, p2p, on_thread)
        count = [left]

        def arrive(_ev: Any = None) -> None:
            msg.end_s = env.now
            if deliver is not None:
                deliver(msg)

        def one() -> None:
            count[0] -= 1
            if count[0] == 0:  # the thread that takes it waits for a core first
                cpu.wake(msg.dst, arrive)

        msg.on_arrival = lambda _m: one()
        start(one)

    def _held(self, msg: Message, nbytes: float) -> None:
        """A shaped link held ``nbytes`` of ``msg`` to its rate: the packet work on both
        ends' cores, at its cost per byte with the link directions busy now."""
        cpu = self.cpu
        busy = self.net.busy_shaped() if cpu.spec.link_cpu_by_load else 0
        cpu.background(msg.src, msg.dst, nbytes, busy)


def _nothing() -> None:
    return None


class CommCpu:
    """The CPU side of communication on CPU hosts: each message costs both ends
    :meth:`HostSpec.message_cpu` core-seconds, run as tasks of their own on the ends'
    pools from the moment it is sent (a communication thread streams the bytes while the
    wire carries them), and it is delivered once the wire and both ends are done. A
    message its sending rank's own thread writes (an ``isend`` whose receive is posted:
    gloo writes in the caller) has the sending end's work on that thread instead, which
    holds the rank meanwhile. An end whose machine has every core taken by compute when
    the message leaves or arrives waits there for a core (:meth:`wake`).

    ``pool_of`` maps a device index to the pool of its machine; ``thread_of`` a device
    to its rank's thread (:class:`~simcore.host.CpuStream`), where it has one.
    """

    __slots__ = ("pool_of", "spec", "thread_of")

    def __init__(
        self,
        spec: HostSpec,
        pool_of: Callable[[int], CpuPool],
        thread_of: Mapping[int, Any] | None = None,
    ) -> None:
        self.spec, self.pool_of = spec, pool_of
        self.thread_of: Mapping[int, Any] = thread_of or {}
        """A device's rank thread (its :class:`~simcore.host.CpuStream`), which writes
        the messages the rank sends itself (``on_thread`` of :meth:`join`)."""

    def join(
        self,
        src: int,
        dst: int,
        nbytes: int,
        messages: int,
        reduce_bytes: int,
        p2p: bool = False,
        on_thread: bool = False,
    ) -> tuple[int, Callable[[Callable[[], None]], None]]:
        """Queue the CPU work of one message (with ``p2p`` each end a messenger's own
        code more, :meth:`HostSpec.p2p_cpu`, at its busy cost on an end whose machine
        has every core computing now; with ``on_thread`` the sending end's on ``src``'s
        rank thread, and each end's ``HostSpec.posted_cpu_s`` beside it, waited for by
        nobody); returns how many completions (the wire's included) its delivery waits
        for, and a function that starts the tasks with the callback to call on each
        completion."""
        spec = self.spec
        send_s = recv_s = spec.message_cpu(nbytes, messages)
        if p2p:
            send_s += spec.p2p_cpu(nbytes, self.computing(src))
            recv_s += spec.p2p_cpu(nbytes, self.computing(dst))
        recv_s += reduce_bytes * spec.reduce_cpu_s_per_byte
        thread = self.thread_of.get(src) if on_thread else None

        def start(on_one: Callable[[], None]) -> None:
            if thread is not None:  # the runtime's own code around the write too
                thread.submit(send_s + spec.isend_s, None, lambda _end: on_one())
                if spec.posted_cpu_s > 0:  # the transport's threads at both ends
                    self.pool_of(src).run(spec.posted_cpu_s, _nothing)
                    self.pool_of(dst).run(spec.posted_cpu_s, _nothing)
            else:
                self.pool_of(src).run(send_s, on_one)
            self.pool_of(dst).run(recv_s, on_one)

        return 3, start

    def background(self, src: int, dst: int, nbytes: float, busy_directions: int = 0) -> None:
        """The network's packet work for ``nbytes`` that crossed it while
        ``busy_directions`` shaped link directions were busy: runnable on both ends'
        cores (:meth:`HostSpec.link_cpu`), waited for by nobody."""
        work = nbytes * self.spec.link_cpu(busy_directions)
        if work > 0:
            self.pool_of(src).run(work, _nothing)
            self.pool_of(dst).run(work, _nothing)

    def wake(self, device: int, then: Callable[[], None]) -> None:
        """A thread of ``device``'s machine woken now: ``then()`` once it has a core,
        after :meth:`wakeup_s` (at once while a core is free of compute)."""
        wait = self.wakeup_s(device)
        if wait > 0:
            Timeout(self.pool_of(device).env, wait).callbacks.append(lambda _ev: then())
        else:
            then()

    def computing(self, device: int) -> bool:
        """Whether every core of ``device``'s machine is taken by compute now."""
        pool = self.pool_of(device)
        return pool.holding >= pool.cores

    def wakeup_s(self, device: int) -> float:
        """How long a thread of ``device``'s machine woken now waits for a core: nothing
        while a core is free of compute, else ``HostSpec.wakeup_s`` times the computing
        threads per core (more threads queue for the cores)."""
        wake = self.spec.wakeup_s
        if wake <= 0:
            return 0.0
        pool = self.pool_of(device)
        holding = pool.holding
        return wake * holding / pool.cores if holding >= pool.cores else 0.0


class _Socket:
    """The send side of one TCP connection (a sender to one destination device): bytes
    handed to the kernel (``queued``) and bytes that have reached the other end
    (``acked``); messages handed over (``sent``) and messages the receiving thread is
    done with (``delivered``). A blocking send still in the kernel's way waits as
    ``waiting``: the ``acked`` count it needs and what to call then; one waiting for the
    receiver to post its header waits as ``waiting_slot``: the ``delivered`` count it
    needs (the sender hands over one message at a time, so there is at most one of
    each).

    The receiving end is one thread that takes the connection's messages in order
    (:meth:`arrive`): while it works on one beyond handing it over (``Message.hold``),
    messages that arrive meanwhile wait in ``backlog`` until it is done."""

    __slots__ = (
        "acked",
        "backlog",
        "delivered",
        "handling",
        "queued",
        "sent",
        "waiting",
        "waiting_slot",
    )

    def __init__(self) -> None:
        self.queued = 0
        self.acked = 0
        self.sent = 0
        self.delivered = 0
        self.waiting: tuple[int, Callable[[], None]] | None = None
        self.waiting_slot: tuple[int, Callable[[], None]] | None = None
        self.handling = False
        self.backlog: list[tuple[Message, Callable[[Message], None] | None]] = []

    def arrive(self, msg: Message, deliver: Callable[[Message], None] | None) -> None:
        """``msg`` has arrived: the receiving thread hands it over (``deliver``) once it is
        done with the ones before it, and is done with it then, or when its ``hold``
        says so."""
        if self.handling:
            self.backlog.append((msg, deliver))
            return
        if deliver is not None:
            deliver(msg)
        if msg.hold is None:
            self.done()
        else:
            self.handling = True
            msg.hold(self._handled)

    def _handled(self) -> None:
        self.handling = False
        self.done()
        while self.backlog and not self.handling:
            msg, deliver = self.backlog.pop(0)
            self.arrive(msg, deliver)

    def ack(self, nbytes: int) -> None:
        """``nbytes`` more have arrived: release the waiting send if its rest now fits."""
        self.acked += nbytes
        if self.waiting is not None and self.waiting[0] <= self.acked:
            release = self.waiting[1]
            self.waiting = None
            release()

    def done(self) -> None:
        """The receiving thread is done with one more message: release a send waiting for
        its header to be posted if it now is."""
        self.delivered += 1
        if self.waiting_slot is not None and self.waiting_slot[0] <= self.delivered:
            release = self.waiting_slot[1]
            self.waiting_slot = None
            release()


class _Sender:
    """A device's sending thread on a CPU host (a rank's messenger): it hands gloo one
    point-to-point message at a time, lowest priority number first, and a blocking send
    returns once the receiver has posted its buffer and the kernel has taken the bytes.

    The receiver's thread for this sender keeps one header receive posted ahead of the
    message it is handling (realrun.runtime.Messenger; payloads' receives are posted
    further ahead), so a message can start only once the receiving thread is done with
    all but the last one sent before it to the same destination (:data:`HEADERS_AHEAD`):
    a small control message queued behind two large ones to a busy peer holds the
    sender until the first of them has arrived, as it holds a real messenger. Then
    each message holds the sender for a handshake (``handshake_s``, calibrated) and
    until what its connection to the destination has not yet delivered, this message
    included, fits in the socket's send buffer (``buffer_bytes``; until the message has
    arrived when 0). The next one waits. A handshake that starts while compute takes
    all its machine's cores first waits for a core (:meth:`CommCpu.wake`)."""

    __slots__ = ("buffer_bytes", "busy", "handshake_s", "heap", "seq", "sockets", "transport")

    HEADERS_AHEAD = 1
    """Header receives a messenger's receiving thread keeps posted beyond the message it
    is handling."""

    def __init__(self, transport: HostTransport, handshake_s: float, buffer_bytes: int = 0) -> None:
        self.transport, self.handshake_s, self.buffer_bytes = transport, handshake_s, buffer_bytes
        self.heap: list[tuple[float, int, Message, int, int, bool]] = []
        self.busy = False
        self.seq = 0
        self.sockets: dict[int, _Socket] = {}

    def queue(self, msg: Message, segments: int, reduce_bytes: int, p2p: bool) -> None:
        heapq.heappush(self.heap, (msg.priority, self.seq, msg, segments, reduce_bytes, p2p))
        self.seq += 1
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self.heap:
            self.busy = False
            return
        self.busy = True
        _prio, _seq, msg, segments, reduce_bytes, p2p = heapq.heappop(self.heap)
        sock = self.sockets.get(msg.dst)
        if sock is None:
            sock = self.sockets[msg.dst] = _Socket()

        def handshake() -> None:
            def go() -> None:
                ev = Timeout(self.transport.net.env, self.handshake_s)
                ev.callbacks.append(lambda _e: self._go(msg, sock, segments, reduce_bytes, p2p))

            self.transport.cpu.wake(msg.src, go)  # the sending thread may wait for a core

        need = sock.sent - self.HEADERS_AHEAD
        if need <= sock.delivered:
            handshake()
        else:
            sock.waiting_slot = (need, handshake)

    def _go(self, msg: Message, sock: _Socket, segments: int, reduce_bytes: int, p2p: bool) -> None:
        sock.queued += msg.nbytes
        sock.sent += 1
        msg.on_bytes = sock.ack
        deliver = msg.on_arrival
        msg.on_arrival = lambda m: sock.arrive(m, deliver)
        mark = sock.queued - self.buffer_bytes
        self.transport._start(msg, segments, reduce_bytes, p2p)
        if mark <= sock.acked:
            self._next()
        else:
            sock.waiting = (mark, self._next)
