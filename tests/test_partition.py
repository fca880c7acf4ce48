"""The partitioner: PipeDream's optimizer reproduced on the shipped profiles (golden
numbers), exactness against brute force on small graphs, the state tree against pairwise
containment, the baselines, and the search's limits."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simcore.partition.optimize as optimize
from simcore.partition import CostModel, PartitionError, partition, prepare
from simcore.partition.antichain import antichain_states, chain_states
from traces import Layer, Trace, TraceMeta, chain, load_builtin

B10 = 1.25e9  # 10 Gbps in bytes/s

# PipeDream's own optimizer (msr-fiddle/pipedream, optimizer/optimizer_graph_hierarchical.py
# with graph/graph.py, one level, -b 1.25e9, default flags, with and without
# --straight_pipeline) run on traces/builtin/pipedream/*.txt by a throwaway harness outside
# the repository that restates that code faithfully in Python 3. Recorded: the DP's
# bottleneck A[0][last][N-1] (seconds per batch) and the replication factor of each stage.
# Inception-v3 is absent: the reference ran out of memory on it (221,564 states).
REFERENCE = {
    ("vgg16", 4, True): (0.21645000000000003, [1, 1, 1, 1]),
    ("vgg16", 4, False): (0.17449849920000002, [3, 1]),
    ("vgg16", 8, True): (0.159531, [1] * 8),
    ("vgg16", 8, False): (0.09335713400000002, [4, 1, 1, 1, 1]),
    ("alexnet", 4, True): (0.028721, [1, 1, 1, 1]),
    ("alexnet", 4, False): (0.0229012016, [2, 1, 1]),
    ("alexnet", 8, True): (0.028721, [1] * 8),
    ("alexnet", 8, False): (0.011619999999999998, [3, 1, 1, 1, 1, 1]),
    ("resnet18", 4, True): (0.069523, [1, 1, 1, 1]),
    ("resnet18", 4, False): (0.06591799999999992, [2, 1, 1]),
    ("resnet18", 8, True): (0.03520699999999996, [1] * 8),
    ("resnet18", 8, False): (0.033883000000000024, [4, 1, 1, 1, 1]),
    ("squeezenet1_0", 4, True): (0.07295400000000002, [1, 1, 1, 1]),
    ("squeezenet1_0", 4, False): (0.07213960746666666, [3, 1]),
    ("squeezenet1_0", 8, True): (0.051094, [1] * 8),
    ("squeezenet1_0", 8, False): (0.035913728895999995, [5, 1, 1, 1]),
    ("gnmt", 4, True): (0.025867999999999988, [1, 1, 1, 1]),
    ("gnmt", 4, False): (0.025867999999999988, [1, 1, 1, 1]),
    ("gnmt", 8, True): (0.019032000000000007, [1] * 8),
    ("gnmt", 8, False): (0.019032000000000007, [1] * 8),
    ("gnmt_large", 4, True): (0.1371290000000001, [1, 1, 1, 1]),
    ("gnmt_large", 4, False): (0.13712900000000006, [1, 1, 1, 1]),
    ("gnmt_large", 8, True): (0.08284499999999999, [1] * 8),
    ("gnmt_large", 8, False): (0.08284499999999999, [1] * 8),
    ("resnet50", 4, True): (0.11149699999999999, [1, 1, 1, 1]),
    ("resnet50", 4, False): (0.11149699999999999, [1, 1, 1, 1]),
    ("resnet50", 8, True): (0.05668399999999999, [1] * 8),
    ("resnet50", 8, False): (0.056220000000000006, [2, 1, 1, 1, 1, 1, 1]),
    ("resnext50", 4, True): (0.151988, [1, 1, 1, 1]),
    ("resnext50", 4, False): (0.15071955759999997, [2, 1, 1]),
    ("resnext50", 8, True): (0.07609500000000002, [1] * 8),
    ("resnext50", 8, False): (0.07503982826666665, [3, 1, 1, 1, 1, 1]),
    ("densenet121", 4, True): (0.08198500000000009, [1, 1, 1, 1]),
    ("densenet121", 4, False): (0.081985, [1, 1, 1, 1]),
    ("densenet121", 8, True): (0.04161500000000007, [1] * 8),
    ("densenet121", 8, False): (0.04161500000000007, [1] * 8),
    ("resnet101", 4, True): (0.10394100000000006, [1, 1, 1, 1]),
    ("resnet101", 4, False): (0.10394100000000006, [1, 1, 1, 1]),
    ("resnet101", 8, True): (0.05212500000000003, [1] * 8),
    ("resnet101", 8, False): (0.05212500000000003, [1] * 8),
    ("resnext101", 4, True): (0.140525, [1, 1, 1, 1]),
    ("resnext101", 4, False): (0.140525, [1, 1, 1, 1]),
    ("resnext101", 8, True): (0.07101000000000002, [1] * 8),
    ("resnext101", 8, False): (0.07101000000000002, [1] * 8),
}

# The same optimizer's data-parallel time per batch (-n N, its "data_parallel_total_time").
REFERENCE_DP = {
    ("vgg16", 4): 0.5001918556,
    ("vgg16", 8): 0.2777674366,
    ("alexnet", 4): 0.16797226599999998,
    ("resnet50", 8): 0.09120721979999999,
    ("gnmt", 8): 0.2824493328,
}

# Where four runs of the reference all chose the same stages, the layers per stage (inputs
# and unused __getitem__ outputs left out). Elsewhere ties make its choice vary from run
# to run (it iterates over a set of objects), so only the bottleneck is compared.
REFERENCE_STAGE_SIZES = {
    ("alexnet", 4, False): [6, 3, 13],
    ("resnet101", 4, True): [54, 91, 108, 93],
    ("resnet50", 4, True): [29, 37, 51, 59],
    ("resnext50", 4, False): [65, 49, 62],
    ("resnext50", 4, True): [29, 35, 48, 64],
    ("resnext50", 8, True): [12, 17, 12, 23, 19, 29, 30, 34],
    ("squeezenet1_0", 4, False): [42, 25],
    ("squeezenet1_0", 4, True): [3, 18, 21, 25],
    ("vgg16", 4, False): [15, 25],
}

# --activation_compression_ratio 1.0 (the activation term on). resnet50 straight differs,
# see test_activation_term_counts_what_crosses_the_cut.
REFERENCE_ACTIVATIONS = {
    ("vgg16", 4, True): (0.38106300000000004, [1, 1, 1, 1]),
    ("vgg16", 8, False): (0.10084139337142857, [7, 1]),
    ("alexnet", 4, False): (0.032460913066666666, [3, 1]),
    ("resnet18", 8, False): (0.043601325376, [5, 2, 1]),
    ("squeezenet1_0", 4, False): (0.0743377176, [4]),
    ("resnet50", 8, False): (0.0822083584, [4, 3, 1]),
    ("gnmt", 8, True): (0.019284999999999997, [1] * 8),
}


def stage_sizes(p, trace):
    g = prepare(trace)
    searched = {g.layer[v] for v in range(g.n)}
    return [sum(1 for i in s.layers if i in searched) for s in p.stages]


@pytest.mark.parametrize(("model", "gpus", "straight"), sorted(REFERENCE))
def test_matches_pipedreams_optimizer(model, gpus, straight):
    bottleneck, replicas = REFERENCE[(model, gpus, straight)]
    trace = load_builtin(model)
    p = partition(trace, gpus, B10, straight=straight)
    assert p.bottleneck_s == pytest.approx(bottleneck, rel=1e-9)
    assert list(p.replicas) == replicas
    assert sum(p.replicas) == gpus
    if (model, gpus) in REFERENCE_DP:
        assert p.data_parallel_s == pytest.approx(REFERENCE_DP[(model, gpus)], rel=1e-9)
    if (model, gpus, straight) in REFERENCE_STAGE_SIZES:
        assert stage_sizes(p, trace) == REFERENCE_STAGE_SIZES[(model, gpus, straight)]


@pytest.mark.parametrize(("model", "gpus", "straight"), sorted(REFERENCE_ACTIVATIONS))
def test_activation_term_matches_the_reference(model, gpus, straight):
    bottleneck, replicas = REFERENCE_ACTIVATIONS[(model, gpus, straight)]
    p = partition(load_builtin(model), gpus, B10, straight=straight, activation_term=True)
    assert p.bottleneck_s == pytest.approx(bottleneck, rel=1e-9)
    assert list(p.replicas) == replicas


def test_activation_term_counts_what_crosses_the_cut():
    """The reference sums the outputs of its augmented antichain, which includes a fork
    node whose branches both lie inside the cut; we count only outputs consumed beyond the
    cut, so on ResNet-50 (straight, 4 GPUs) we find a faster pipeline (the reference's
    is 0.258149 s)."""
    p = partition(load_builtin("resnet50"), 4, B10, straight=True, activation_term=True)
    assert p.bottleneck_s == pytest.approx(0.24976499999999996, rel=1e-9)
    assert p.bottleneck_s < 0.25814899999999996


def test_state_counts_match_the_reference():
    counts = {
        "vgg16": 40,
        "alexnet": 22,
        "resnet18": 100,
        "squeezenet1_0": 99,
        "gnmt": 99,
        "gnmt_large": 1495,
        "resnet50": 240,
        "resnet101": 410,
        "densenet121": 430,
        "inception_v3": 221564,
    }
    for model, n in counts.items():
        assert antichain_states(prepare(load_builtin(model))).count == n, model


def test_raw_inception_is_partitioned_exactly():
    """PipeDream's optimizer runs out of memory here; the search over all 221,564 states
    gives the same answer as the slow exhaustive bisection did while developing it."""
    trace = load_builtin("inception_v3")
    straight = partition(trace, 8, B10, straight=True)
    assert straight.states == 221564 and straight.exact
    assert straight.bottleneck_s == pytest.approx(0.09197, abs=5e-7)
    replicated = partition(trace, 8, B10)
    assert replicated.bottleneck_s == pytest.approx(0.086733, abs=5e-7)
    assert list(replicated.replicas) == [3, 1, 1, 1, 1, 1]


def test_narrowed_search_agrees_with_windowed_search(monkeypatch):
    """Force the state-tree search on mid-sized graphs and compare."""
    cases = [
        ("resnet50", 8, False),
        ("squeezenet1_0", 8, False),
        ("densenet121", 4, True),
        ("resnext50", 8, True),
        ("vgg16", 8, False),
    ]
    monkeypatch.setattr(optimize, "DENSE_STATES", 0)
    for model, gpus, straight in cases:
        p = partition(load_builtin(model), gpus, B10, straight=straight)
        bottleneck, replicas = REFERENCE[(model, gpus, straight)]
        assert p.bottleneck_s == pytest.approx(bottleneck, rel=1e-9), model
        assert list(p.replicas) == replicas


# ---- exactness against brute force ---------------------------------------------------------


def random_dag(data, n):
    """A single-source DAG over ``n`` layers (every layer has a predecessor)."""
    layers = [
        Layer(
            f"l{i}",
            data.draw(st.floats(0.0, 1.0)),
            data.draw(st.floats(0.0, 1.0)),
            param_bytes=data.draw(st.integers(0, 3)) * 10**8,
            activation_bytes=data.draw(st.integers(0, 3)) * 10**8,
        )
        for i in range(n)
    ]
    edges = set()
    for j in range(1, n):
        edges.add((data.draw(st.integers(0, j - 1)), j))
        for i in range(j):
            if data.draw(st.integers(0, 5)) == 0:
                edges.add((i, j))
    return Trace(TraceMeta("random", "V100", 1), tuple(layers), tuple(sorted(edges)))


def brute_force(trace, gpus, straight, activation_term):
    """Best bottleneck over every chain of down-sets and every replication, by
    enumeration (tiny graphs only)."""
    g = prepare(trace)
    cm = CostModel(gpus, B10, straight, activation_term)
    n = g.n
    pred = [set(g.pred[v]) for v in range(n)]
    ideals = [
        frozenset(c)
        for k in range(1, n + 1)
        for c in itertools.combinations(range(n), k)
        if 0 in c and all(pred[v] <= set(c) for v in c)
    ]
    full = frozenset(range(n))

    def cost(a, b, r):
        inside = b - a
        return cm.stage_time(
            sum(g.compute_s[v] for v in inside),
            sum(g.param_bytes[v] for v in inside),
            r,
            g.boundary_bytes(a) if a else 0,
            g.boundary_bytes(b) if b != full else 0,
        )

    best: dict[tuple[frozenset, int], float] = {}
    for u in range(1, gpus + 1):
        for j in sorted(ideals, key=len):
            v = cost(frozenset(), j, u) if (u == 1 or not straight) else math.inf
            for k in ideals:
                if k < j:
                    for r in range(1, (2 if straight else u)):
                        prev = best.get((k, u - r), math.inf)
                        v = min(v, max(prev, cost(k, j, r)))
            best[(j, u)] = v
    return best[(full, gpus)]


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 7),
    gpus=st.integers(1, 4),
    straight=st.booleans(),
    act=st.booleans(),
)
def test_search_is_optimal_on_small_graphs(data, n, gpus, straight, act):
    trace = random_dag(data, n)
    expected = brute_force(trace, gpus, straight, act)
    if not math.isfinite(expected):
        with pytest.raises(PartitionError):
            partition(trace, gpus, B10, straight=straight, activation_term=act)
        return
    p = partition(trace, gpus, B10, straight=straight, activation_term=act)
    assert p.bottleneck_s == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert sum(p.replicas) == gpus
    covered = sorted(i for s in p.stages for i in s.layers)
    assert covered == list(range(n))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 9))
def test_state_tree_agrees_with_pairwise_containment(data, n):
    """Down-set and up-set maxima over the state tree equal those over all pairs."""
    stt = antichain_states(prepare(random_dag(data, n)))
    S = stt.count + 1
    bits = np.concatenate([np.zeros((1, stt.bits.shape[1]), dtype=np.uint64), stt.bits])
    inside = np.ones((S, S), dtype=bool)
    for w in range(bits.shape[1]):
        inside &= (bits[:, None, w] & ~bits[None, :, w]) == 0
    strict = inside & ~np.eye(S, dtype=bool)
    v = np.random.default_rng(n).random((2, S))
    below = np.where(strict[None], v[:, :, None], -np.inf).max(axis=1)
    above = np.where(strict.T[None], v[:, :, None], -np.inf).max(axis=1)
    np.testing.assert_allclose(stt.order.strictly_below(v), below)
    np.testing.assert_allclose(stt.order.strictly_above(v), above)
    np.testing.assert_allclose(
        stt.order.down(v, 1), np.where(inside[None], v[:, :, None], -np.inf).max(axis=1)
    )


def test_pieces_without_structure_are_enumerated():
    """Two sources feeding two joins (a 'crown'): no node is comparable with all others
    inside, so that piece is listed down-set by down-set."""
    layers = [Layer(f"l{i}", 0.1 * (i + 1), 0.0) for i in range(6)]
    edges = ((0, 1), (0, 2), (1, 3), (2, 3), (1, 4), (2, 4), (3, 5), (4, 5))
    trace = Trace(TraceMeta("crown", "V100", 1), tuple(layers), edges)
    stt = antichain_states(prepare(trace))
    # down-sets containing l0: {0}, +1, +2, +12, +123, +124, +1234, all
    assert stt.count == 8
    assert partition(trace, 3, B10, straight=True).bottleneck_s == pytest.approx(
        brute_force(trace, 3, True, False)
    )


# ---- baselines, conventions, errors -------------------------------------------------------


def test_baselines_cut_the_chain_evenly():
    trace = chain(
        TraceMeta("c", "V100", 1),
        [
            Layer(f"l{i}", t, 0.0, param_bytes=p)
            for i, (t, p) in enumerate([(1, 0), (1, 0), (1, 0), (1, 900), (3, 0), (2, 100)])
        ],
    )
    layers = partition(trace, 3, B10, method="layers")
    assert [len(s.layers) for s in layers.stages] == [2, 2, 2]
    compute = partition(trace, 3, B10, method="compute")
    assert [s.compute_s for s in compute.stages] == [3.0, 4.0, 2.0]
    params = partition(trace, 3, B10, method="params")
    assert [s.param_bytes for s in params.stages] == [0, 900, 100]
    best = partition(trace, 3, B10, straight=True)
    assert best.bottleneck_s == 4.0
    for p in (layers, compute, params):
        assert p.bottleneck_s >= best.bottleneck_s
        assert p.replicas == (1, 1, 1)


def test_given_cuts_make_exactly_those_stages():
    trace = chain(
        TraceMeta("c", "V100", 1),
        [Layer(f"l{i}", 1.0 + i, 0.0, param_bytes=10 * i) for i in range(6)],
    )
    best = partition(trace, 3, B10, straight=True)
    cuts = [trace.layers[min(s.layers)].name for s in best.stages[1:]]
    again = partition(trace, 3, B10, cuts=cuts)
    assert [s.layers for s in again.stages] == [s.layers for s in best.stages]
    assert again.method == "given" and again.replicas == (1, 1, 1)
    odd = partition(trace, 3, B10, cuts=["l1", "l5"])
    assert [len(s.layers) for s in odd.stages] == [1, 4, 1]
    assert odd.bottleneck_s == pytest.approx(2 + 3 + 4 + 5)  # l1..l4 on one stage
    for cuts, words in (
        (["l2"], "make 2 stages, not 3"),
        (["l2", "nope"], "'nope' is not a layer"),
        (["l0", "l2"], "'l0' is not a layer that can start"),
        (["l4", "l2"], "does not come after"),
    ):
        with pytest.raises(PartitionError, match=words):
            partition(trace, 3, B10, cuts=cuts)


def test_inputs_and_unused_outputs_join_their_neighbours():
    trace = load_builtin("gnmt")
    p = partition(trace, 4, B10)
    stage_of = p.stage_of_layer()
    assert sorted(stage_of) == list(range(len(trace.layers)))
    for i, layer in enumerate(trace.layers):
        if layer.kind == "input":
            assert stage_of[i] == 0
        if layer.op.startswith("__getitem__") and not trace.successors[i]:
            assert stage_of[i] == stage_of[max(trace.predecessors[i])]


def test_speedups_follow_the_cost_model():
    p = partition(load_builtin("vgg16"), 4, B10)
    assert p.speedup_vs_1gpu == pytest.approx(p.single_gpu_s / p.bottleneck_s)
    assert p.speedup_vs_dp == pytest.approx(0.5001918556 / 0.17449849920000002)
    d = p.to_dict()
    for key in ("stages", "bottleneck_s", "speedup_vs_1gpu", "speedup_vs_dp", "wall_s"):
        assert key in d
    assert {"layers", "replicas", "compute_s"} <= set(d["stages"][0])
    assert d["stages"][0]["layers"][0] == "node1"


def test_memory_limit_rules_out_stages_that_do_not_fit():
    trace = chain(
        TraceMeta("m", "V100", 1),
        [Layer(f"l{i}", 1.0, 1.0, param_bytes=10**9, activation_bytes=10**6) for i in range(4)],
    )
    free = partition(trace, 2, B10)
    assert free.replicas == (1, 1) or free.replicas == (2,)
    limited = partition(trace, 4, B10, memory_limit_bytes=7e9)
    # A one-layer first stage holds 3 GB of weights, gradients and momentum plus, for its
    # 4 batches in flight, 3 stashed weight versions and 4 MB of activations: 6.004 GB.
    # Two layers on one stage, replicated or not, need more than 7 GB.
    assert limited.replicas == (1, 1, 1, 1)
    with pytest.raises(PartitionError, match="memory limit"):
        partition(trace, 2, B10, memory_limit_bytes=7e9)


def test_too_few_layers_and_bad_arguments_are_refused():
    trace = chain(TraceMeta("t", "V100", 1), [Layer("a", 1, 1), Layer("b", 1, 1)])
    with pytest.raises(PartitionError, match="layers than stages"):
        partition(trace, 3, B10, straight=True)
    with pytest.raises(PartitionError, match="cannot make 3"):
        partition(trace, 3, B10, method="layers")
    with pytest.raises(PartitionError, match="method"):
        partition(trace, 2, B10, method="random")
    assert partition(trace, 3, B10).replicas in {(3,), (2, 1), (1, 2)}


def test_graphs_with_too_many_states_fall_back_to_a_topological_order():
    trace = load_builtin("nasnetamobile")
    p = partition(trace, 4, B10, straight=True)
    assert not p.exact
    g = prepare(trace)
    assert p.states == g.n
    chain_best = optimize.solve(g, chain_states(g), CostModel(4, B10, True))
    assert p.bottleneck_s == pytest.approx(chain_best.bottleneck_s)
