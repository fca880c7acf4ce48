"""The trace data model, our JSON format, the PipeDream importer, the built-ins."""

import json

import pytest

from tests.conftest import synthetic_trace
from traces import (
    Layer,
    Trace,
    TraceFormatError,
    TraceMeta,
    UnknownModelError,
    builtin_models,
    chain,
    default_model,
    load_builtin,
    load_file,
    load_trace,
    pipedream,
    save_trace,
)
from traces.jsonfmt import from_dict, to_dict


def test_rescale_batch_scales_times_and_activations_not_params():
    tr = synthetic_trace(batch=8)
    big = tr.rescale_batch(16)
    assert big.meta.batch_size == 16
    assert big.compute_s == pytest.approx(2 * tr.compute_s)
    assert big.activation_bytes == 2 * tr.activation_bytes
    assert big.param_bytes == tr.param_bytes


def test_rescale_device_divides_times():
    tr = synthetic_trace()
    fast = tr.rescale_device(2.0, "A100")
    assert fast.compute_s == pytest.approx(tr.compute_s / 2)
    assert fast.meta.device == "A100"
    with pytest.raises(ValueError):
        tr.rescale_device(0)


def test_trace_rejects_backward_edges_and_duplicates():
    meta = TraceMeta("m", "cpu", 1)
    a, b = Layer("a", 1, 1), Layer("b", 1, 1)
    with pytest.raises(ValueError, match="backwards"):
        Trace(meta, (a, b), ((1, 0),))
    with pytest.raises(ValueError, match="twice"):
        Trace(meta, (a, a))


def test_json_round_trip(tmp_path):
    tr = synthetic_trace()
    path = tmp_path / "t.json"
    save_trace(tr, path)
    back = load_file(path)
    assert back.layers == tr.layers and back.edges == tr.edges
    assert back.meta.batch_size == tr.meta.batch_size


def test_json_loader_sorts_layers_topologically():
    d = to_dict(synthetic_trace(n_layers=3))
    d["layers"].reverse()
    tr = from_dict(d)
    assert [layer.name for layer in tr.layers] == ["l0", "l1", "l2"]


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["layers"][1].__setitem__("forward_s", "slow"), "layers[1].forward_s"),
        (lambda d: d["layers"][0].pop("name"), "layers[0].name"),
        (lambda d: d["meta"].__setitem__("batch_size", 0), "meta.batch_size"),
        (lambda d: d.__setitem__("version", 99), "version"),
        (lambda d: d["edges"].append(["l0", "nope"]), "edges[3]"),
        (lambda d: d["edges"].append(["l2", "l0"]), "edges"),
        (lambda d: d["layers"][0].__setitem__("kind", "loss"), "layers[0].kind"),
    ],
)
def test_malformed_json_names_file_field_and_problem(tmp_path, mutate, field):
    d = to_dict(synthetic_trace(n_layers=4))
    mutate(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(TraceFormatError) as err:
        load_file(path)
    assert str(path) in str(err.value)
    assert err.value.field == field


def test_not_json_at_all(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{nope")
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        load_file(path)


PIPEDREAM_TEXT = """\
node1 -- Input -- forward_compute_time=5.000, backward_compute_time=0.000, activation_size=1204224.000, parameter_size=0.000
node2 -- Conv2d(3, 8) -- forward_compute_time=1.500, backward_compute_time=3.000, activation_size=100.0, parameter_size=864.000
node3 -- ReLU -- forward_compute_time=0.500, backward_compute_time=0.250, activation_size=[40.0; 60.0], parameter_size=0.000
node4 -- Add -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=100.0, parameter_size=0.000
\tnode1 -- node2
\tnode2 -- node3
\tnode3 -- node4
\tnode2 -- node4
"""


def test_pipedream_import():
    tr = pipedream.parse(PIPEDREAM_TEXT, model="tiny")
    assert tr.meta.batch_size == 2  # 1204224 = 2 * 3*224*224*4
    assert [layer.name for layer in tr.layers] == ["node1", "node2", "node3", "node4"]
    assert tr.layers[0].kind == "input"
    assert tr.layers[1].forward_s == pytest.approx(1.5e-3)
    assert tr.layers[2].activation_bytes == 100  # multi-output sizes are summed
    assert tr.predecessors[3] == (1, 2)  # the join
    assert tr.forward_s == pytest.approx(2e-3)  # the input node does not run


@pytest.mark.parametrize(
    "text, field",
    [
        (
            "node1 -- X -- forward_compute_time=abc, backward_compute_time=0, activation_size=0, "
            "parameter_size=0\n",
            "line 1: forward_compute_time",
        ),
        (
            "node1 -- X -- forward_compute_time=1, activation_size=0, parameter_size=0\n",
            "line 1: backward_compute_time",
        ),
        ("garbage line\n", "line 1"),
    ],
)
def test_pipedream_malformed(text, field):
    with pytest.raises(TraceFormatError) as err:
        pipedream.parse(text, source="g.txt", batch_size=1)
    assert err.value.field == field and "g.txt" in str(err.value)


def test_builtins_are_complete_and_match_published_parameter_counts():
    names = set(builtin_models())
    paper_ten = {
        "vgg16",
        "resnet18",
        "resnet50",
        "resnet101",
        "alexnet",
        "resnext50",
        "resnext101",
        "inception_v3",
        "densenet121",
        "squeezenet1_0",
    }
    assert paper_ten | {"gnmt", "gnmt_large"} <= names
    assert default_model() == "resnet50"
    # torchvision's parameter counts
    assert load_builtin("resnet50").param_count == 25_557_032
    assert load_builtin("vgg16").param_count == 138_357_544
    assert load_builtin("alexnet").param_count == 61_100_840
    r50 = load_builtin("resnet50")
    assert r50.meta.batch_size == 128 and r50.meta.provenance
    assert load_builtin("densenet121").meta.batch_size == 64


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(UnknownModelError) as err:
        load_trace("resnet5")
    assert "resnet50" in str(err.value)


def test_chain_helper():
    tr = chain(TraceMeta("m", "cpu", 1), [Layer("a", 1, 1), Layer("b", 1, 1)])
    assert tr.edges == ((0, 1),) and tr.successors == ((1,), ())


def test_an_analytic_device_peak_is_a_typed_field_and_old_names_still_read():
    old = TraceMeta("m", "analytic:1.57e+13", 8)  # a file written before the field
    assert old.peak_flop_per_s == 1.57e13
    assert TraceMeta("m", "V100", 8).peak_flop_per_s == 0.0
    assert TraceMeta("m", "analytic:bogus", 8).peak_flop_per_s == 0.0
    new = TraceMeta("m", "my estimate", 8, peak_flop_per_s=2e12)
    trace = Trace(
        new,
        (
            Layer(
                name="l0",
                op="linear",
                forward_s=1e-3,
                backward_s=2e-3,
                param_bytes=4,
                activation_bytes=4,
            ),
        ),
    )
    d = to_dict(trace)
    assert d["meta"]["peak_flop_per_s"] == 2e12
    assert from_dict(d).meta.peak_flop_per_s == 2e12
