"""The layer graph from torch.fx: functional joins are layers, and branchy models have
exactly the joins their architecture says."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from realrun import zoo  # noqa: E402
from realrun.graph import layer_graph  # noqa: E402


def _graph(name: str, batch: int = 2):
    with torch.device("meta"):
        model = zoo.build(name)
    return model, layer_graph(model.train(), zoo.example_inputs(name, batch, "meta"))


def test_densenet_dense_layers_join_all_earlier_feature_maps() -> None:
    model, g = _graph("densenet121")
    preds = {layer.name: layer.preds for layer in g.layers}
    # block 1 (features.4): dense layer i concatenates the stem's output and layers 0..i-1
    for i in range(6):
        norm = f"features.4.layers.{i}.norm1"
        (cat,) = preds[norm]
        assert g.layer(cat).op == "cat"
        expected = ("features.3", *(f"features.4.layers.{k}.conv2" for k in range(i)))
        assert preds[cat] == expected
    # the block's output joins the stem and all six layers, and feeds the transition
    (block_out,) = preds["features.5.norm"]
    assert preds[block_out] == ("features.3", *(f"features.4.layers.{k}.conv2" for k in range(6)))
    joins = [layer for layer in g.layers if len(layer.preds) > 1]
    # every dense layer but the first of each block (input alone), plus each block's output
    assert len(joins) == sum(n - 1 for n in (6, 12, 24, 16)) + 4
    assert sum(layer.param_bytes for layer in g.layers) == 4 * sum(
        p.numel() for p in model.parameters()
    )


def test_inception_v3_blocks_join_their_branches() -> None:
    _, g = _graph("inception_v3")
    (cat,) = g.layer("Mixed_5c.branch1x1.conv").preds
    assert g.layer(cat).preds == (
        "Mixed_5b.branch1x1.relu",
        "Mixed_5b.branch5x5_2.relu",
        "Mixed_5b.branch3x3dbl_3.relu",
        "Mixed_5b.branch_pool.relu",
    )
    # the pooled branch goes through a functional avg_pool2d, which is a layer
    (pool,) = g.layer("Mixed_5b.branch_pool.conv").preds
    assert g.layer(pool).op == "avg_pool2d"
    # InceptionE splits a branch in two and joins the halves before the block's join
    halves = ("Mixed_7b.branch3x3_2a.relu", "Mixed_7b.branch3x3_2b.relu")
    (inner,) = [layer for layer in g.layers if layer.preds == halves]
    assert inner.op == "cat"
    # the auxiliary classifier forks off Mixed_6e's output
    (mixed_6e,) = g.layer("AuxLogits.pool").preds
    assert mixed_6e in g.layer("Mixed_7a.branch3x3_1.conv").preds


def test_residual_add_is_a_join_of_branch_and_shortcut() -> None:
    _, g = _graph("resnet18")
    (add,) = g.layer("layer1.0.relu2").preds
    assert g.layer(add).op == "add"
    assert g.layer(add).preds == ("layer1.0.bn2", "maxpool")
    (add2,) = g.layer("layer2.0.relu2").preds
    assert g.layer(add2).preds == ("layer2.0.bn2", "layer2.0.downsample.1")
    assert g.layer("flatten").preds == ("avgpool",)
    assert g.layers[0].kind == "input" and g.layers[0].activation_bytes == 2 * 3 * 224 * 224 * 4


def test_tuple_outputs_are_folded_and_only_used_items_counted() -> None:
    _, g = _graph("residual_lstm", batch=2)
    lstm = g.layer("lstms.0")
    assert lstm.activation_bytes == 2 * 35 * 1024 * 4  # output only, not (h, c)
    (add,) = [n for n in g.layers if n.op == "add" and "lstms.0" in n.preds]
    assert add.preds == ("embedding", "lstms.0")


def test_shared_module_called_twice_gets_distinct_names_and_params_once() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.fc(x))

    g = layer_graph(Twice(), (torch.randn(2, 4),))
    assert [layer.name for layer in g.layers] == ["x", "fc", "fc#2"]
    assert [layer.param_bytes for layer in g.layers] == [0, 80, 0]
    assert g.edges == [("x", "fc"), ("fc", "fc#2")]
