"""gossip: partner schedules from their definitions, who meets whom, bytes per GPU for
each exchange, timing stories, efficiency at scale, errors."""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtsim.cli import main
from dtsim.resolve import build_config, load_preset
from dtsim.spec import RunSpec
from simcore import SimConfig, TopologySpec, simulate
from simcore.config import OPTIMIZERS, ConfigError
from simcore.schemes.gossip import (
    AVERAGE_PASSES,
    EXCHANGES,
    PACK_PASSES,
    GossipOptions,
    partners,
    primitive_polynomial,
    random_permutation,
    virtual_ranks,
)
from tests.helpers import ring_topology
from traces import Layer, TraceMeta, chain

POWERS = [2, 4, 8, 16, 32, 64]


def times_x(v: int, p: int) -> int:
    """One Singer step written out: shift the rank's bits left, reduce by the primitive
    polynomial when the top bit falls out."""
    bits = p.bit_length() - 1
    v <<= 1
    return v ^ primitive_polynomial(bits) if v >> bits else v


@pytest.mark.parametrize("p", POWERS)
def test_singer_rotation_is_one_cycle_through_the_nonzero_ranks(p):
    seen, v = [], 1
    for _ in range(p - 1):
        seen.append(v)
        v = times_x(v, p)
    assert v == 1 and sorted(seen) == list(range(1, p))
    for c in range(3):
        pi, nxt = virtual_ranks(p, c), virtual_ranks(p, c + 1)
        assert sorted(pi) == list(range(p)) and pi[0] == 0
        assert nxt == [times_x(v, p) for v in pi]
    assert virtual_ranks(p, 3, "shift") == [(r - 3) % p for r in range(p)]
    assert virtual_ranks(p, 3, "none") == list(range(p))


@pytest.mark.parametrize("p", POWERS)
def test_random_rotation_cycles_through_p_seeded_permutations(p):
    """The authors' latest rotation: rank 0 draws p - 1 permutations, broadcasts them, and
    the cycles run through them after the identity; here a fixed seed draws them, so every
    rank (and the simulator) computes the same ones without a broadcast."""
    perms = [tuple(virtual_ranks(p, c, "random")) for c in range(p)]
    assert perms[0] == tuple(range(p))
    assert all(sorted(q) == list(range(p)) for q in perms)
    assert [tuple(virtual_ranks(p, c + p, "random")) for c in range(p)] == perms
    assert perms[1] == random_permutation(p, 1)
    if p >= 8:  # drawn, not a shift or a field multiplication: most differ from both
        assert len(set(perms)) == p
        assert perms[1] not in {
            tuple(virtual_ranks(p, c, rot)) for c in range(p) for rot in ("shift", "singer")
        }


@pytest.mark.parametrize("rotation", ["singer", "random", "shift", "none"])
@pytest.mark.parametrize("p", POWERS)
def test_partners_follow_the_definitions(p, rotation):
    bits = p.bit_length() - 1
    for step in range(3 * bits):
        d = 1 << (step % bits)
        pi = virtual_ranks(p, step // bits, rotation)
        send, recv = partners(p, step, "hypercube", rotation)
        assert send == recv
        assert all(pi[r] ^ pi[send[r]] == d and send[send[r]] == r for r in range(p))
        send, recv = partners(p, step, "dissemination", rotation)
        for r in range(p):
            assert pi[send[r]] == (pi[r] - d) % p and pi[recv[r]] == (pi[r] + d) % p
            assert recv[send[r]] == r


def cycles_until_all_met(p: int, schedule: str, rotation: str) -> int | None:
    bits = p.bit_length() - 1
    met: set[frozenset[int]] = set()
    for cycle in range(p - 1):
        for h in range(bits):
            send, _recv = partners(p, cycle * bits + h, schedule, rotation)
            met.update(frozenset((r, s)) for r, s in enumerate(send))
        if len(met) == p * (p - 1) // 2:
            return cycle + 1
    return None


@pytest.mark.parametrize("schedule", ["hypercube", "dissemination"])
@pytest.mark.parametrize("p", POWERS)
def test_every_pair_meets_directly_within_p_minus_1_cycles(p, schedule):
    cycles = cycles_until_all_met(p, schedule, "singer")
    assert cycles is not None and cycles <= max(1, p - 1)
    if schedule == "hypercube":
        assert cycles <= max(1, p - (p.bit_length() - 1))  # exponents h - c cover Z_(p-1)


def test_the_reference_shift_rotation_never_pairs_ranks_three_apart():
    assert cycles_until_all_met(4, "hypercube", "shift") is not None
    for p in (8, 16, 64):
        assert cycles_until_all_met(p, "hypercube", "shift") is None
        met = {
            frozenset((r, s))
            for t in range(20 * p)
            for r, s in enumerate(partners(p, t, "hypercube", "shift")[0])
        }
        assert frozenset((0, 3)) not in met


def small_trace(n_layers=3, param_bytes=2_000_000):
    layers = [
        Layer(f"l{i}", 0.004, 0.008, param_bytes=param_bytes, activation_bytes=1000)
        for i in range(n_layers)
    ]
    return chain(TraceMeta("g", "P100", 8), layers)


@pytest.mark.parametrize(
    "exchange, copies", [("weights", 2), ("gradients", 1), ("gradients+weights", 2)]
)
@pytest.mark.parametrize("fidelity", ["analytic", "detailed"])
def test_bytes_each_gpu_sends_per_iteration_do_not_grow_with_p(fidelity, exchange, copies):
    """One model's worth per exchanged array (weights and SGD momentum: two; a gradient:
    one; a gradient and the weights: two), whatever p."""
    trace = small_trace()
    per_gpu = {}
    for p in (2, 4, 8, 16, 32):
        # Every worker's messages (the mean field would simulate two machines' only).
        r = simulate(
            SimConfig(
                trace=trace,
                topology=TopologySpec(load_preset("ib-cluster"), p),
                scheme="gossip",
                fidelity=fidelity,
                iterations=3,
                warmup_iterations=1,
                options=GossipOptions(mean_field="off", exchange=exchange),
            )
        )
        assert r.extra["exchange_bytes"] == copies * trace.param_bytes
        sent = defaultdict(int)
        for s in r.span_records():
            if s.stream == "send":
                sent[(s.device, s.iteration)] += s.nbytes
        assert len(sent) == p * 4
        per_gpu[p] = set(sent.values())
    assert all(v == {copies * trace.param_bytes} for v in per_gpu.values())


def test_weights_exchange_momentum_and_adam_state_plain_sgd_none() -> None:
    from simcore.schemes.gossip import exchanged_copies

    assert [exchanged_copies(opt, "weights") for opt in ("sgd", "momentum", "adam")] == [1, 2, 3]
    assert {exchanged_copies(opt, "gradients") for opt in OPTIMIZERS} == {1}


@pytest.mark.parametrize("fidelity", ["analytic", "detailed"])
def test_two_gpus_one_layer_closed_form(fidelity):
    """Two GPUs on a direct link, one layer of n bytes, exchanging gradients: the gradient
    leaves when backward ends and arrives after α + n/B; the next forward waits for it,
    then averages and updates ((3 + 5)·n / memory bandwidth): an iteration is f + b + α +
    n/B + update."""
    n, bw, lat = 4_000_000, 10e9, 2e-6
    trace = chain(TraceMeta("one", "V100", 1), [Layer("l0", 0.01, 0.02, param_bytes=n)])
    topo = ring_topology(2, bw, lat)
    r = simulate(
        SimConfig(
            trace=trace,
            topology=topo,
            scheme="gossip",
            fidelity=fidelity,
            iterations=3,
            options=GossipOptions(exchange="gradients"),
        )
    )
    update = (
        (AVERAGE_PASSES + OPTIMIZERS["momentum"][1])
        * n
        / (topo.gpu_spec.memory_bandwidth_bytes_per_s)
    )
    assert r.iteration_time_s == pytest.approx(0.03 + lat + n / bw + update, rel=1e-9)
    assert r.extra["exchange_bytes"] == n and r.extra["rotation"] == "singer"


@pytest.mark.parametrize("fidelity", ["analytic", "detailed"])
@pytest.mark.parametrize("bw", [10e9, 0.1e9])
def test_two_gpus_one_layer_closed_form_exchanging_weights(fidelity, bw):
    """The authors' exchange: at the start of an iteration a worker averages in the
    weights and momentum (2n bytes) its partner sent at the start of the last one
    ((3 + 3)·n / R), packs its own into the message ((2 + 2)·n / R) and sends it, and
    computes f + b and steps (5·n / R) while it travels. Compute-bound (10 GB/s) an
    iteration is average + pack + f + b + step; link-bound (0.1 GB/s: 80 ms for 2n
    against 30 ms of compute) the next start waits for the message sent at this one, so
    an iteration is average + pack + α + 2n/B."""
    n, lat = 4_000_000, 2e-6
    trace = chain(TraceMeta("one", "V100", 1), [Layer("l0", 0.01, 0.02, param_bytes=n)])
    topo = ring_topology(2, bw, lat)
    r = simulate(
        SimConfig(trace=trace, topology=topo, scheme="gossip", fidelity=fidelity, iterations=4)
    )
    rate = topo.gpu_spec.memory_bandwidth_bytes_per_s
    average, step = 2 * AVERAGE_PASSES * n / rate, OPTIMIZERS["momentum"][1] * n / rate
    pack = 2 * PACK_PASSES * n / rate
    comm = lat + 2 * n / bw
    expected = average + pack + max(0.03 + step, comm)
    assert r.iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert r.extra["exchange_bytes"] == 2 * n and r.extra["exchange"] == "weights"


def test_one_gpu_is_the_single_gpu_baseline():
    r = simulate(
        SimConfig(trace=small_trace(), topology=ring_topology(1, 1e9, 1e-6), scheme="gossip")
    )
    assert r.speedup == pytest.approx(1.0) and r.comm_bytes_total == 0


def test_backward_overlaps_the_exchange_of_earlier_layers():
    """Many layers: every gradient but the last layer's is on its way while backward
    still runs, so the iteration costs far less than compute plus the whole exchange."""
    trace = small_trace(n_layers=8, param_bytes=8_000_000)
    topo = ring_topology(2, 5e9, 1e-6)
    r = simulate(SimConfig(trace=trace, topology=topo, scheme="gossip", iterations=3))
    whole_exchange = trace.param_bytes / 5e9
    assert r.iteration_time_s < trace.compute_s + 0.3 * whole_exchange


def test_shuffle_sends_the_input_batch_to_the_partner():
    spec = RunSpec(
        scheme="gossip",
        gpus=4,
        topology="ib-cluster",
        model="resnet18",
        iterations=1,
        fidelity="analytic",
    )
    on = simulate(build_config(spec))
    off = simulate(build_config(spec.replace(**{"scheme.shuffle": "false"})))
    batch = sum(layer.activation_bytes for layer in on_trace(spec) if layer.kind == "input")
    assert batch > 0
    assert on.extra["exchange_bytes"] - off.extra["exchange_bytes"] == batch
    assert on.comm_bytes_total - off.comm_bytes_total == 4 * 2 * batch


def on_trace(spec):
    config = build_config(spec)
    return config.trace.rescale_batch(config.effective_batch_size).layers


def test_gossip_keeps_resnet50_efficiency_at_128_gpus_on_infiniband():
    """GossipGraD's headline: about 100% compute efficiency for ResNet-50 on 128 GPUs over
    InfiniBand (1-GPU iteration time / 128-GPU iteration time, same per-GPU batch)."""
    spec = RunSpec(topology="ib-cluster", fidelity="analytic", iterations=3)
    one = simulate(build_config(spec.replace(scheme="dp", gpus=1), record_spans=False))
    many = simulate(build_config(spec.replace(scheme="gossip", gpus=128), record_spans=False))
    assert one.iteration_time_s / many.iteration_time_s >= 0.95
    assert len(many.per_gpu_utilization) == 128


@pytest.mark.parametrize("gpus", ["3", "6", "12"])
def test_non_power_of_two_gpus_is_a_one_line_error(capsys, gpus):
    with pytest.raises(SystemExit) as ex:
        main(["run", "--scheme", "gossip", "--gpus", gpus])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"--gpus: {gpus} is not allowed" in err and "power of two" in err


def test_options_are_checked():
    with pytest.raises(ConfigError, match="choose one of: hypercube, dissemination"):
        build_config(RunSpec(scheme="gossip", scheme_options={"schedule": "ring"}))
    assert GossipOptions().rotation == "singer"
    pairs = set(combinations(range(4), 2))
    assert {
        tuple(sorted((r, s))) for t in range(2) for r, s in enumerate(partners(4, t)[0])
    } <= pairs


def test_a_gossip_step_also_averages_with_the_partner() -> None:
    """The passes a worker's updates of an iteration make of the weights, which the
    validation fits a run's measured steps with: the optimizer's alone for a lone worker
    and for the other schemes; with a partner, gossip's averaging (read both, write one,
    per exchanged array) on top."""
    from simcore.schemes import get_scheme

    gossip = get_scheme("gossip")
    for opt, (state, passes) in OPTIMIZERS.items():
        for exchange in EXCHANGES:
            assert gossip.step_passes(opt, 1, exchange) == passes
        assert gossip.step_passes(opt, 4) == passes + AVERAGE_PASSES * (1 + state)
        assert gossip.step_passes(opt, 4, "gradients") == passes + AVERAGE_PASSES
        assert gossip.step_passes(opt, 4, "gradients+weights") == passes + 2 * AVERAGE_PASSES
        assert get_scheme("dp").step_passes(opt, 4) == passes


@pytest.mark.parametrize("exchange", ["gradients", "weights"])
def test_a_message_moves_only_once_its_receive_is_posted(monkeypatch, exchange):
    """The real worker keeps its receives posted one iteration ahead (realrun.schemes.
    gossip), and gloo moves a message only once its receive is posted: rank ``r``'s
    gradient of a layer in iteration ``t`` leaves no earlier than its partner used the
    gradient of that layer of iteration ``t - 1`` (exchanging weights: its weights, used at
    the start of ``t``). Four ranks of the emulated cluster share two cores and drift
    apart, so some sends are held."""
    from simcore.schemes import gossip

    used, moved, held = {}, [], []
    use, move, send = gossip.Gossip._use, gossip.Gossip._move, gossip.Gossip._send

    def record_use(self, r, it, slot):
        used[(r, it, slot)] = self.ctx.env.now
        use(self, r, it, slot)

    def record_move(self, r, it, slot, on_thread=False):
        moved.append((self.partners_of(it)[0][r], it, slot, self.ctx.env.now))
        move(self, r, it, slot, on_thread)

    def record_send(self, r, it, slot):
        send(self, r, it, slot)
        held.extend(k for k, v in self.held.items() if v == (r, it, slot))

    monkeypatch.setattr(gossip.Gossip, "_use", record_use)
    monkeypatch.setattr(gossip.Gossip, "_move", record_move)
    monkeypatch.setattr(gossip.Gossip, "_send", record_send)
    layers = [
        Layer(f"l{i}", 0.002 * (i + 1), 0.004, param_bytes=1_000_000 * (4 - i)) for i in range(4)
    ]
    simulate(
        SimConfig(
            trace=chain(TraceMeta("g", "cpu", 8), layers),
            topology=TopologySpec(load_preset("netns"), 4),
            scheme="gossip",
            iterations=6,
            options=GossipOptions(exchange=exchange),
            # exchanging weights, every worker's iteration is alike: jitter makes them drift
            compute_jitter=0.3 if exchange == "weights" else 0.0,
        )
    )
    assert held, "no send was held: the case does not exercise the receive window"
    later = [(dst, it, slot, t) for dst, it, slot, t in moved if it > 0]
    assert later
    for dst, it, slot, t in later:
        assert t >= used[(dst, it - 1, slot)]


@settings(max_examples=60, deadline=None)
@given(
    bits=st.integers(1, 6),
    cycle=st.integers(0, 40),
    schedule=st.sampled_from(["hypercube", "dissemination"]),
    rotation=st.sampled_from(["singer", "random", "shift", "none"]),
    data=st.data(),
)
def test_one_cycle_of_pairwise_averaging_gives_the_global_mean_exactly(
    bits, cycle, schedule, rotation, data
):
    """The weights exchange with no updates in between: every worker sets its model to the
    mean of its own and the one it receives; over the log2(p) steps of one cycle every
    worker ends at the mean of all p models, exactly (dyadic values: no rounding), on
    either schedule and whatever the rotation (within a cycle the virtual ranks are fixed:
    the hypercube's distances 1, 2, 4, ... span all bits; dissemination's sum to p)."""
    p = 1 << bits
    models = [
        [
            float(v)
            for v in data.draw(st.lists(st.integers(-(2**20), 2**20), min_size=3, max_size=3))
        ]
        for _ in range(p)
    ]
    mean = [sum(col) / p for col in zip(*models)]
    for step in range(cycle * bits, (cycle + 1) * bits):
        _send, recv = partners(p, step, schedule, rotation)
        models = [[(a + b) / 2 for a, b in zip(models[r], models[recv[r]])] for r in range(p)]
    assert all(m == mean for m in models)
