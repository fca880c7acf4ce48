"""Recording PyTorch profiler (Kineto) traces that :mod:`traces.kineto` can import.

:func:`record_trace` runs training steps of a model under ``torch.profiler`` with every
layer's forward inside a ``record_function`` range named ``layer::<name>`` (layer names as
in :mod:`realrun.graph`), and stores the layer graph as the trace's ``"dtsim"`` metadata.
Backward needs no ranges: the importer matches autograd's backward functions to the
forward ops by sequence number (see :mod:`traces.kineto`).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import torch
import torch.fx as fx
from torch.profiler import ProfilerActivity, profile, record_function

from realrun import zoo
from realrun.graph import LayerGraph, layer_graph, tensors_in
from traces.atomic import atomic_path
from traces.kineto import METADATA_KEY, RANGE_PREFIX


class _RangeInterpreter(fx.Interpreter):
    """Runs a traced module with each layer node inside its ``layer::`` range."""

    def __init__(self, graph: LayerGraph) -> None:
        super().__init__(graph.module)
        self.ranges = {
            layer.node.name: RANGE_PREFIX + layer.name
            for layer in graph.layers
            if layer.kind == "layer"
        }

    def run_node(self, n: fx.Node) -> Any:
        label = self.ranges.get(n.name)
        if label is None:
            return super().run_node(n)
        with record_function(label):
            return super().run_node(n)


def graph_metadata(graph: LayerGraph, *, model: str, batch_size: int, device: str) -> dict:
    """The ``"dtsim"`` metadata object describing ``graph`` (see :mod:`traces.kineto`)."""
    dtype = next((p.dtype for p in graph.module.parameters()), torch.float32)
    return {
        "model": model,
        "batch_size": batch_size,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "framework": f"PyTorch {torch.__version__}",
        "date": datetime.date.today().isoformat(),
        "layers": [
            {
                "name": layer.name,
                "op": layer.op,
                "kind": layer.kind,
                "param_bytes": layer.param_bytes,
                "activation_bytes": layer.activation_bytes,
            }
            for layer in graph.layers
        ],
        "edges": [list(e) for e in graph.edges],
    }


def record_trace(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    path: str,
    *,
    name: str,
    steps: int = 3,
    warmup: int = 1,
) -> None:
    """Profile ``warmup`` + ``steps`` forward/backward steps of ``model`` on ``inputs``
    with ``torch.profiler`` and write the Kineto trace of the last ``steps`` to ``path``
    (atomically). Backward starts from a gradient of ones for every output."""
    if steps < 1 or warmup < 0:
        raise ValueError("steps must be >= 1 and warmup >= 0")
    model.train()
    graph = layer_graph(model, inputs)
    runner = _RangeInterpreter(graph)
    first = next(iter(tensors_in(inputs)))
    on_gpu = first.device.type == "cuda"
    device = torch.cuda.get_device_name(first.device) if on_gpu else "cpu"
    batch_size = int(first.shape[0])

    def step() -> None:
        _training_step(graph, runner, inputs)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    for _ in range(warmup):
        step()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
            prof.step()
        prof.add_metadata_json(
            METADATA_KEY,
            json.dumps(graph_metadata(graph, model=name, batch_size=batch_size, device=device)),
        )
    with atomic_path(path, suffix=".json") as tmp:
        prof.export_chrome_trace(tmp)


def _training_step(graph: LayerGraph, runner: fx.Interpreter, inputs: tuple[Any, ...]) -> None:
    """One forward (layers in their ranges) and backward from a gradient of ones for every
    output."""
    graph.module.zero_grad(set_to_none=True)
    outs = [t for t in tensors_in(runner.run(*inputs)) if t.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])


def record_chakra(
    model: torch.nn.Module, inputs: tuple[Any, ...], path: str, *, warmup: int = 1
) -> None:
    """Record one training step of ``model`` on ``inputs`` as a PyTorch user would for
    Chakra (an ``ExecutionTraceObserver`` host trace and a Kineto trace of the same step,
    under ``torch.profiler``'s schedule), with every layer's forward in its ``layer::``
    range, and link and convert the pair with chakra's tools into the Chakra ET ``path``
    (:func:`traces.chakra.link_pytorch`). ``warmup`` untimed steps come first."""
    import os
    import tempfile
    import warnings

    from torch.profiler import ExecutionTraceObserver, schedule

    from traces.chakra import link_pytorch

    model.train()
    graph = layer_graph(model, inputs)
    runner = _RangeInterpreter(graph)
    on_gpu = next(iter(tensors_in(inputs))).device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="dtsim-chakra-") as tmp:
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end")
        host, device = os.path.join(tmp, "host.json"), os.path.join(tmp, "kineto.json")
        observer = ExecutionTraceObserver()
        observer.register_callback(host)
        with profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=max(warmup, 1), active=1),
            on_trace_ready=lambda p: p.export_chrome_trace(device),
        ) as prof:
            for i in range(max(warmup, 1) + 1):
                last = i == max(warmup, 1)
                if last:
                    observer.start()
                _training_step(graph, runner, inputs)
                if last:
                    observer.stop()
                prof.step()
        observer.unregister_callback()
        with atomic_path(path, suffix=".et") as out:
            link_pytorch(host, device, out)


def record_zoo_trace(
    name: str,
    batch_size: int,
    path: str,
    *,
    device: str = "cpu",
    steps: int = 3,
    warmup: int = 1,
    threads: int | None = 1,
) -> None:
    """:func:`record_trace` for zoo model ``name`` on random inputs of ``batch_size``."""
    if threads is not None:
        torch.set_num_threads(threads)
    with torch.device(device):
        model = zoo.build(name)
    inputs = zoo.example_inputs(name, batch_size, device)
    record_trace(model, inputs, path, name=name, steps=steps, warmup=warmup)


def main(argv: list[str] | None = None) -> int:
    """``python -m realrun.kineto MODEL BATCH OUT.json``: record a zoo model's trace."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m realrun.kineto",
        description="Record a PyTorch profiler (Kineto) trace of "
        "training steps of a zoo model, with layer:: "
        "ranges, for 'sim trace convert'.",
    )
    ap.add_argument("model", choices=zoo.names())
    ap.add_argument("batch_size", type=int)
    ap.add_argument("out")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args(argv)
    record_zoo_trace(
        args.model,
        args.batch_size,
        args.out,
        device=args.device,
        steps=args.steps,
        warmup=args.warmup,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
