"""The transport between the schemes and the network, as stories with exact simulated times.

Two ranks' devices ``a`` and ``z`` on one link of 1 GB/s and 10 us: a 1 MB message is on
the wire for 1 ms and arrives 1.01 ms after it left.
"""

import pytest
from simpy import Environment

from simcore.collectives import Collectives
from simcore.host import CpuPool, CpuStream
from simcore.network import AnalyticNetwork, DetailedNetwork
from simcore.topology import GlooSpec, HostSpec, TopologyBuilder
from simcore.transport import CommCpu, HostTransport, Transport

B = 1e9  # bytes/s
LAT = 1e-5  # s
MB = 1_000_000
WIRE_S = MB / B + LAT  # a 1 MB message's time from its first byte to its last's arrival


def two_hosts(gloo: GlooSpec | None = None):
    b = TopologyBuilder("two")
    b.device("a", "gpu", 0)
    b.device("z", "gpu", 1)
    b.link("a", "z", "ethernet", B, LAT)
    return b.build([0, 1], gloo=gloo)


def host_transport(env, topo, cores: int = 4, net_cls=DetailedNetwork, **spec):
    """A :class:`HostTransport` over a fresh network of ``topo``, both devices on one pool
    of ``cores`` cores; returns it and the pool."""
    pool = CpuPool(env, cores)
    cpu = CommCpu(HostSpec(cores=cores, **spec), lambda _d: pool)
    return HostTransport(net_cls(env, topo), cpu), pool


def arrivals(env, log):
    """A callback that logs ``(tag, arrival time)``."""
    return lambda m: log.append((m.tag, env.now))


# ---- the null transport: GPU clusters ---------------------------------------------------------
@pytest.mark.parametrize("net_cls", [DetailedNetwork, AnalyticNetwork])
def test_a_null_transport_delivers_exactly_when_the_network_does(net_cls):
    """Every kind of send arrives when the network's own send of the same message does,
    to the last bit: 1.01 ms for 1 MB; the null transport's sends are the network's."""
    topo = two_hosts()

    def story(send_of):
        env = Environment()
        net = net_cls(env, topo)
        send = send_of(net)
        log = []
        send(0, 1, MB, arrivals(env, log), tag="m")
        env.timeout(5e-3).callbacks.append(lambda _e: send(0, 1, MB, arrivals(env, log), tag="n"))
        env.run()
        return log

    direct = story(lambda net: net.send)
    assert direct == [("m", pytest.approx(WIRE_S)), ("n", pytest.approx(5e-3 + WIRE_S))]
    kinds = [
        lambda net: Transport(net).send,
        lambda net: Transport(net).isend,
        lambda net: Transport(net).isend_on_thread,
        lambda net: Transport(net).collective_sender(4, reduces=True),
    ]
    for kind in kinds:
        assert story(kind) == direct
    net = net_cls(Environment(), topo)
    tr = Transport(net)
    assert tr.send == tr.isend == tr.isend_on_thread == tr.collective_sender() == net.send
    assert tr.ring_segments(64 * MB, 4) == 1


def test_only_the_null_transport_on_the_analytic_network_lets_collectives_be_closed_forms():
    """A ring all-reduce of 4 MB over the two ranks: through the null transport the
    analytic fidelity computes it in one event and sends no message; through a host
    transport it runs as its messages (their CPU competes with compute), the two
    ranks' 2 MB each way twice: 4 messages."""
    for on_hosts, messages in ((False, 0), (True, 4)):
        env = Environment()
        if on_hosts:
            transport, _pool = host_transport(env, two_hosts(), net_cls=AnalyticNetwork)
        else:
            transport = Transport(AnalyticNetwork(env, two_hosts()))
        net = transport.net
        done = []
        Collectives(net, transport).allreduce([0, 1], 4 * MB, "ring", done.append)
        env.run()
        assert len(done) == 1 and len(net.messages) == messages
        assert transport.closed_form is (messages == 0)
        assert (transport.post is None) is (messages > 0)


# ---- the transport of CPU hosts -----------------------------------------------------------------
def test_a_cpu_transport_adds_its_per_message_cost():
    """Each end's CPU runs beside the wire from the moment the message is sent, and the
    message is delivered once the wire and both ends are done: 2 ms per message at each
    end holds a 1 MB message (1.01 ms on the wire) until 2 ms; 0.1 ms does not delay it.
    A collective's send that travels as 4 segments costs 4 messages' CPU (8 ms); summed
    into the receiver's buffer at 1 ns a byte, the receiving end 1 ms more (9 ms)."""
    log = []
    for tag, per_message_s, send_of in (
        ("costly", 2e-3, lambda tr: tr.isend),
        ("cheap", 1e-4, lambda tr: tr.isend),
        ("segments", 2e-3, lambda tr: tr.collective_sender(4)),
        ("reduced", 2e-3, lambda tr: tr.collective_sender(4, reduces=True)),
    ):
        env = Environment()
        tr, _pool = host_transport(
            env, two_hosts(), message_cpu_s=per_message_s, reduce_cpu_s_per_byte=1e-9
        )
        send_of(tr)(0, 1, MB, arrivals(env, log), tag=tag)
        env.run()
    assert log == [
        ("costly", pytest.approx(2e-3)),
        ("cheap", pytest.approx(WIRE_S)),
        ("segments", pytest.approx(8e-3)),
        ("reduced", pytest.approx(9e-3)),
    ]


def test_a_message_a_device_sends_itself_costs_no_cpu():
    env = Environment()
    tr, pool = host_transport(env, two_hosts(), message_cpu_s=2e-3)
    log = []
    tr.isend(0, 0, MB, arrivals(env, log), tag="self")
    env.run()
    assert log == [("self", 0.0)] and pool.busy_s == 0.0


def _send_then_compute(on_thread: bool) -> list:
    """Rank ``a``'s thread sends 1 MB to ``z``, then computes 1 ms (4 cores, 1 ms per
    message at each end, 0.5 ms of the runtime's code around an ``isend``); the log."""
    env = Environment()
    pool = CpuPool(env, 4)
    thread = CpuStream(pool)
    spec = HostSpec(cores=4, message_cpu_s=1e-3, isend_s=5e-4)
    tr = HostTransport(
        DetailedNetwork(env, two_hosts()), CommCpu(spec, lambda _d: pool, {0: thread})
    )
    log = []
    send = tr.isend_on_thread if on_thread else tr.isend
    send(0, 1, MB, arrivals(env, log), tag="arrived")
    thread.submit(1e-3, ("forward", "next", 0, 0, -1), lambda end: log.append(("computed", end)))
    env.run()
    return log


def test_an_on_thread_send_holds_the_rank():
    """Written by the rank's own thread (a pipeline's ``isend``), the message's sending
    end (1 ms) and the runtime's code around it (0.5 ms) run on that thread first: the
    compute after it ends at 2.5 ms, and the message arrives once the thread has written
    it (1.5 ms). Written by a communication thread, the compute runs beside it (cores to
    spare) and ends at 1 ms; the message arrives when the wire is done (1.01 ms)."""
    assert _send_then_compute(True) == [
        ("arrived", pytest.approx(1.5e-3)),
        ("computed", pytest.approx(2.5e-3)),
    ]
    assert _send_then_compute(False) == [
        ("computed", pytest.approx(1e-3)),
        ("arrived", pytest.approx(WIRE_S)),
    ]


def test_a_messengers_sends_wait_for_their_handshake_and_the_one_before():
    """A parameter server's messages go through the device's messenger, one at a time:
    each waits 0.2 ms for its handshake, and with no send buffer the second waits until
    the first has arrived (1.21 ms), then for its own handshake: it arrives at 2.42 ms.
    An ``isend`` to a posted receive waits for neither."""
    env = Environment()
    tr, _pool = host_transport(env, two_hosts(), p2p_handshake_s=2e-4)
    log = []
    tr.send(0, 1, MB, arrivals(env, log), tag="first")
    tr.send(0, 1, MB, arrivals(env, log), tag="second")
    tr.isend(0, 1, 1, arrivals(env, log), tag="posted")
    env.run()
    first = 2e-4 + WIRE_S
    assert log == [
        ("posted", pytest.approx(1 / B + LAT)),
        ("first", pytest.approx(first)),
        ("second", pytest.approx(first + 2e-4 + WIRE_S)),
    ]


def test_a_ring_travels_as_gloos_segments_on_cpu_hosts():
    """gloo cuts a ring all-reduce's buffer into segments, a multiple of the ranks (at
    least two per rank): 8 MB over 2 ranks in 1 MiB segments is 8 segments, 4 per send;
    the null transport sends each as one message."""
    topo = two_hosts(GlooSpec(segment_bytes=1 << 20))
    env = Environment()
    tr, _pool = host_transport(env, topo)
    assert tr.ring_segments(8 << 20, 2) == 4
    assert tr.ring_segments(1024, 2) == 2
    assert Transport(DetailedNetwork(env, topo)).ring_segments(8 << 20, 2) == 1
