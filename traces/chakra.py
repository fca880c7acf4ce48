"""MLCommons Chakra execution traces (ETs): reading them, and into a layer trace.

A Chakra ET is one file per rank, ``NAME.RANK.et``: a ``ChakraProtoMsg.GlobalMetadata``
message, then ``ChakraProtoMsg.Node`` messages, each prefixed by its length as a varint.
The schema and the length-prefixed encoding are ``mlc-chakra``'s own
(``chakra.schema.protobuf.et_def_pb2``, ``chakra.src.third_party.utils.protolib``); this
module imports them only when a Chakra file is read or written, and says in one line what
to install when the package is absent (:class:`ChakraMissing`).

Two kinds of ET become a :class:`~traces.model.Trace` (:func:`load`):

* **dtsim's own** (written by :mod:`analysis.chakra_export` from a run's records; the global
  metadata has ``dtsim.format``): every layer pass is a compute node carrying its layer's
  name, pass, iteration and sizes. A layer's forward (backward) time is the sum of its
  forward (backward) nodes' durations in the first measured iteration, on the lowest rank
  that ran it (micro-batches add up to the batch; where replicated pipeline stages share
  them, the mean pass times the micro-batches); its parameter and activation bytes and
  its inputs (the layer graph's edges) are the node's attributes. Data-loading input
  nodes, which no rank runs, are in the global metadata. The set of rank files must be
  complete.
* **Converted from a PyTorch run** (PyTorch ``ExecutionTraceObserver`` host trace linked
  with its Kineto trace by ``chakra_trace_link``, then ``chakra_converter PyTorch``; see
  :func:`link_pytorch`): compute nodes are operators, nested by their ``ctrl_deps``
  (parent), with exclusive durations. The layers are the ``record_function`` ranges named
  ``layer::<name>`` where the run has them (what ``sim profile --format chakra`` and
  :mod:`realrun.kineto` record), else the top-level operators of the forward pass that
  autograd recorded (those with a sequence number), the loss (the last one, when it
  returns a scalar) left out. A layer's forward time is the inclusive duration of its
  nodes (on a GPU, of the kernels they launched, which chakra places under them); its
  backward time that of the ``autograd::engine::evaluate_function`` nodes whose
  backward function has the sequence number of one of its operators (``AccumulateGrad``
  belongs to the layer whose backward ran just before it, as in :mod:`traces.kineto`); its
  parameter bytes the gradients accumulated there; its activation bytes the tensors its
  last operator returns. Layers form a chain in forward order.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from traces.errors import TraceError, TraceFormatError, unreadable
from traces.model import Layer, Trace, TraceMeta, chain
from traces.toposort import sort_layers

INSTALL_HINT = "pip install -e '.[chakra]' (the mlc-chakra package)"
"""What to install for Chakra traces."""

DTSIM_FORMAT = "dtsim-chakra"
"""Value of the ``dtsim.format`` global-metadata attribute of the ETs dtsim writes."""

RANGE_PREFIX = "layer::"
"""Prefix of the ``record_function`` range of a layer's forward (as in :mod:`traces.kineto`)."""

RANK_FILE = re.compile(r"^(?P<name>.+)\.(?P<rank>\d+)\.et$")
"""``NAME.RANK.et``: how the files of one set of rank ETs are named."""

_EVAL_PREFIX = "autograd::engine::evaluate_function: "
_ACCUMULATE = "AccumulateGrad"
_ROOT_NAMES = (
    "[pytorch|profiler|execution_trace|thread]",
    "[pytorch|profiler|execution_graph|thread]",
)
_ELEMENT_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "half": 2,
    "long int": 8,
    "int": 4,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
}
_DTYPE_NAMES = {4: "float32", 8: "float64", 2: "float16"}


class ChakraMissing(TraceError):
    """The ``mlc-chakra`` package is not installed."""

    def __init__(self, what: str = "Chakra execution traces") -> None:
        super().__init__(f"{what} need the chakra extra: {INSTALL_HINT}")


def available() -> bool:
    """Whether ``mlc-chakra`` can be imported."""
    try:
        schema()
    except ChakraMissing:
        return False
    return True


def schema(what: str = "Chakra execution traces") -> tuple[Any, Any]:
    """``(et_def_pb2, protolib)``: chakra's schema module and its length-prefixed message
    encoding (:class:`ChakraMissing` naming ``what`` when the package is absent)."""
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils import protolib
    except ImportError:
        raise ChakraMissing(what) from None
    return et_def_pb2, protolib


# ---- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EtFile:
    """One rank's execution trace as read: the global metadata's attributes by name and
    the nodes (``ChakraProtoMsg.Node`` messages) in file order."""

    path: str
    version: str
    metadata: dict[str, Any]
    nodes: tuple[Any, ...]

    @property
    def is_dtsim(self) -> bool:
        """Whether dtsim wrote this file (:data:`DTSIM_FORMAT`)."""
        return self.metadata.get("dtsim.format") == DTSIM_FORMAT


def attr_value(attr: Any) -> Any:
    """The value of a ``ChakraProtoMsg.AttributeProto`` (a list for the list kinds)."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    return list(value.values) if kind.endswith("_list") else value


def attrs(node: Any) -> dict[str, Any]:
    """A node's (or the global metadata's) attributes by name."""
    return {a.name: attr_value(a) for a in node.attr}


class _Reader:
    """A binary file that remembers where a read came up short (the end of the file)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.short_at = data, 0, -1

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        out = self.data[self.pos : end]
        if len(out) < n and self.short_at < 0:
            self.short_at = self.pos
        self.pos += len(out)
        return out


def read(path: str | os.PathLike[str]) -> EtFile:
    """Read one Chakra ET file (gzipped or not) with chakra's schema and decoder;
    :class:`TraceFormatError` naming the file when it cannot be read, is cut short, or is
    not a Chakra ET (a message that does not parse, fields the schema does not have, a node
    without a valid type or with a duplicate id)."""
    pb, protolib = schema()
    from google.protobuf import message as pb_message
    from google.protobuf import unknown_fields

    src = os.fspath(path)
    try:
        with open(src, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise TraceFormatError(src, "", unreadable(exc)) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceFormatError(src, "", f"a broken gzip file ({exc})") from None
    if not raw:
        raise TraceFormatError(src, "", "empty file: not a Chakra execution trace")
    reader = _Reader(raw)

    def fail(where: str, problem: str) -> None:
        raise TraceFormatError(src, where, f"{problem}: not a Chakra execution trace")

    def decode(msg: Any, where: str) -> bool:
        start = reader.pos
        problem = None
        try:
            ok = protolib.decodeMessage(reader, msg)
        except (pb_message.DecodeError, ValueError, RuntimeError) as exc:
            problem = f"message at byte {start} does not parse ({exc})"
        if reader.short_at >= 0 and reader.short_at != start:
            raise TraceFormatError(
                src,
                where,
                f"cut short: the message at byte {start} runs past the end of the file "
                f"({len(raw)} bytes); the file is truncated",
            )
        if problem:
            fail(where, problem)
        if ok and len(unknown_fields.UnknownFieldSet(msg)):
            fail(where, f"message at byte {start} has fields the Chakra schema does not have")
        return bool(ok)

    meta = pb.GlobalMetadata()
    if not decode(meta, "global metadata"):
        fail("global metadata", "no global metadata message")
    nodes: list[Any] = []
    seen: set[int] = set()
    while True:
        node = pb.Node()
        where = f"node {len(nodes)}"
        if not decode(node, where):
            break
        if node.type == pb.INVALID_NODE or not pb.NodeType.Name(node.type):
            fail(where, f"node {node.id} has no valid type")
        if node.id in seen:
            fail(where, f"node id {node.id} appears twice")
        seen.add(node.id)
        nodes.append(node)
    if reader.pos != len(raw):
        raise TraceFormatError(src, "", f"cut short at byte {reader.pos} of {len(raw)}")
    if not nodes:
        fail("", "no nodes")
    md = attrs(meta)
    count = md.get("dtsim.node_count")
    if md.get("dtsim.format") == DTSIM_FORMAT and isinstance(count, int) and count != len(nodes):
        raise TraceFormatError(
            src, "", f"cut short: {len(nodes)} of its {count} nodes; the file is truncated"
        )
    return EtFile(src, meta.version, md, tuple(nodes))


def rank_files(path: str | os.PathLike[str]) -> list[str]:
    """The files of the set of rank ETs ``path`` names, by rank: a directory holding one set
    ``NAME.0.et``... ``NAME.(N-1).et``, one file of such a set, or a single ``.et`` file.
    :class:`TraceFormatError` when a rank of the set is missing (the ranks must be 0 to
    N-1, N as the files' metadata says when dtsim wrote them) or a directory holds no set
    or several."""
    src = os.fspath(path)
    if os.path.isdir(src):
        sets: dict[str, dict[int, str]] = {}
        for entry in sorted(os.listdir(src)):
            m = RANK_FILE.match(entry)
            if m:
                sets.setdefault(m["name"], {})[int(m["rank"])] = os.path.join(src, entry)
        if not sets:
            raise TraceFormatError(src, "", "holds no Chakra execution traces (NAME.RANK.et)")
        if len(sets) > 1:
            raise TraceFormatError(
                src,
                "",
                f"holds several sets of rank files ({', '.join(sorted(sets))}); give one file",
            )
        (name, ranks), folder = next(iter(sets.items())), src
    else:
        m = RANK_FILE.match(os.path.basename(src))
        if not m:
            return [src]
        folder, name = os.path.dirname(src) or ".", m["name"]
        ranks = {}
        for entry in os.listdir(folder):
            mm = RANK_FILE.match(entry)
            if mm and mm["name"] == name:
                ranks[int(mm["rank"])] = os.path.join(folder, entry)
        ranks.setdefault(int(m["rank"]), src)
    top = max(ranks)
    for r in range(top + 1):
        if r not in ranks:
            missing = os.path.join(folder, f"{name}.{r}.et")
            raise TraceFormatError(
                missing, "", f"missing: the set has ranks up to {top}, so rank {r} is needed"
            )
    return [ranks[r] for r in range(top + 1)]


def read_set(path: str | os.PathLike[str]) -> list[EtFile]:
    """Every rank file of the set ``path`` names (:func:`rank_files`), read; for a set
    dtsim wrote, a file missing past the last one found is reported too."""
    files = [read(p) for p in rank_files(path)]
    world = files[0].metadata.get("dtsim.world_size") if files[0].is_dtsim else None
    if isinstance(world, int) and world > len(files):
        first = files[0].path
        m = RANK_FILE.match(os.path.basename(first))
        name = m["name"] if m else first
        missing = os.path.join(os.path.dirname(first), f"{name}.{len(files)}.et")
        raise TraceFormatError(
            missing, "", f"missing: the set was written for {world} ranks (0 to {world - 1})"
        )
    return files


# ---- into a layer trace ----------------------------------------------------------------------


def load(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> Trace:
    """The layer trace of the Chakra ET (set) ``path`` names (see the module docs);
    ``model``, ``batch_size`` and ``device`` override what the trace says."""
    files = read_set(path)
    if files[0].is_dtsim:
        trace = _from_dtsim(files)
    else:
        trace = _from_pytorch(files[0], batch_size=batch_size)
    meta = trace.meta
    changes: dict[str, Any] = {}
    if model:
        changes["model"] = model
    if device:
        changes["device"] = device
    if changes:
        from dataclasses import replace

        meta = replace(meta, **changes)
    trace = Trace(meta, trace.layers, trace.edges)
    if batch_size and batch_size != trace.meta.batch_size and files[0].is_dtsim:
        trace = trace.rescale_batch(batch_size)
    return trace


def _from_dtsim(files: list[EtFile]) -> Trace:
    """The layer trace in the compute nodes of a set dtsim wrote."""
    head = files[0]
    md = head.metadata
    measured = int(md.get("dtsim.warmup_iterations", 0))
    micro = max(1, int(md.get("dtsim.microbatches", 1)))
    found: dict[str, dict[str, Any]] = {}
    order: dict[str, int] = {}
    for et in files:
        here: dict[str, dict[str, Any]] = {}
        for node in et.nodes:
            a = attrs(node)
            layer, kind = a.get("dtsim.layer"), a.get("dtsim.pass")
            if layer is None or kind not in ("forward", "backward"):
                continue
            if a.get("dtsim.iteration") != measured:
                continue
            rec = here.setdefault(layer, {"forward": [], "backward": [], "attrs": a})
            seconds = a.get("dtsim.duration_s")
            rec[kind].append(seconds if seconds is not None else node.duration_micros / 1e6)
            if kind == "forward":
                rec["attrs"] = a
            order.setdefault(layer, int(a.get("dtsim.layer_index", len(order))))
        for layer, rec in here.items():
            found.setdefault(layer, rec)
    if not found:
        raise TraceFormatError(
            head.path, "", f"no layer compute nodes in iteration {measured} of any rank"
        )

    def batch_s(passes: list[float]) -> float:
        """A layer's time for the batch: its passes of the iteration add up to it, or, in
        a pipeline whose replicated stages share the micro-batches, their mean times the
        micro-batches."""
        if micro == 1 or not passes:
            return sum(passes)
        return sum(passes) / len(passes) * micro

    names = sorted(found, key=lambda n: order[n])
    layers: list[Layer] = []
    edges: list[tuple[str, str]] = []
    for spec in json.loads(md.get("dtsim.input_layers", "[]")):
        layers.append(
            Layer(
                name=spec["name"],
                op=spec.get("op", ""),
                kind="input",
                forward_s=float(spec.get("forward_s", 0.0)),
                backward_s=0.0,
                activation_bytes=int(spec.get("activation_bytes", 0)),
            )
        )
        edges += [(spec["name"], d) for d in spec.get("successors", []) if d in found]
    for name in names:
        rec = found[name]
        a = rec["attrs"]
        layers.append(
            Layer(
                name=name,
                op=a.get("dtsim.op", ""),
                kind=a.get("dtsim.kind", "layer"),
                forward_s=batch_s(rec["forward"]),
                backward_s=batch_s(rec["backward"]),
                param_bytes=int(a.get("dtsim.param_bytes", 0)),
                activation_bytes=int(a.get("dtsim.activation_bytes", 0)),
                flops=a.get("dtsim.flops"),
            )
        )
        inputs = [src for src in a.get("dtsim.inputs", []) if src in found]
        if not inputs and len(layers) > 1 and layers[-2].kind != "input" and a.get("dtsim.inputs"):
            inputs = [layers[-2].name]  # its inputs did not run here: follow the one before
        edges += [(src, name) for src in inputs]
    meta = TraceMeta(
        model=md.get("dtsim.model") or "chakra",
        device=md.get("dtsim.device") or "unknown",
        batch_size=int(md.get("dtsim.batch_size", 1)),
        dtype=md.get("dtsim.dtype", "float32"),
        framework=md.get("dtsim.framework", ""),
        provenance=(
            f"imported from the Chakra execution traces {os.path.basename(head.path)} "
            f"({len(files)} ranks): layer passes of iteration {measured}, "
            f"{md.get('dtsim.source', 'a dtsim run')}"
        ),
        source_format="chakra",
    )
    try:
        return sort_layers(meta, layers, edges)
    except ValueError as exc:
        raise TraceFormatError(head.path, "dtsim.inputs", str(exc)) from None


@dataclass
class _Op:
    """A node of a converted PyTorch ET, with its children (by ``ctrl_deps``)."""

    node: Any
    attrs: dict[str, Any]
    children: list[_Op]

    @property
    def name(self) -> str:
        return str(self.node.name)

    @property
    def seq(self) -> int:
        return int(self.attrs.get("seq_id", -1))

    def walk(self) -> Iterator[_Op]:
        yield self
        for c in self.children:
            yield from c.walk()

    @property
    def on_gpu(self) -> bool:
        """Whether it is a GPU operator (chakra's ``is_cpu_op`` false)."""
        return self.attrs.get("is_cpu_op") is False

    def inclusive_us(self, gpu: bool = False) -> float:
        """Its duration and its descendants' (``gpu``: only its GPU operators' among them,
        the kernels it launched)."""
        own = float(self.node.duration_micros) if self.on_gpu or not gpu else 0.0
        return own + sum(c.inclusive_us(gpu) for c in self.children)


def _tensor_bytes(shapes: str, types: str) -> tuple[int, int]:
    """``(bytes, bytes per element)`` of the tensors in an ET node's input or output
    (``shapes`` and ``types`` as the converter writes them: Python literals)."""
    try:
        shape_l = ast.literal_eval(shapes) if shapes else []
        type_l = ast.literal_eval(types) if types else []
    except (ValueError, SyntaxError):
        return 0, 0
    total, elem = 0, 0
    for shape, typ in zip(shape_l, type_l):
        m = re.fullmatch(r"Tensor\((.+)\)", str(typ))
        if not m or not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            continue
        size = _ELEMENT_BYTES.get(m[1], 4)
        elem = elem or size
        n = 1
        for d in shape:
            n *= d
        total += n * size
    return total, elem


def _storages(values: str) -> set[int]:
    """The storage ids of the tensors in an ET node's input or output values (each tensor
    is ``[tensor id, storage id, offset, elements, element bytes, device]``)."""
    try:
        data = ast.literal_eval(values) if values else []
    except (ValueError, SyntaxError):
        return set()
    out: set[int] = set()

    def visit(x: Any) -> None:
        if isinstance(x, list):
            if len(x) == 6 and all(isinstance(v, int) for v in x[:5]) and isinstance(x[5], str):
                out.add(x[1])
            else:
                for v in x:
                    visit(v)

    visit(data)
    return out


def _is_view(op: _Op) -> bool:
    """Whether an operator only returns views of its inputs (no new data)."""
    outs = _storages(op.node.outputs.values)
    return bool(outs) and outs <= _storages(op.node.inputs.values)


def _from_pytorch(et: EtFile, *, batch_size: int | None) -> Trace:
    """The layer trace of an ET converted from a PyTorch run (see the module docs)."""
    src = et.path
    ops = {n.id: _Op(n, attrs(n), []) for n in et.nodes}
    roots: list[_Op] = []
    for op in sorted(ops.values(), key=lambda o: o.node.id):
        parent = next((ops[p] for p in op.node.ctrl_deps if p in ops), None)
        (parent.children if parent is not None else roots).append(op)
    if not any(o.node.duration_micros for o in ops.values()):
        raise TraceFormatError(
            src,
            "duration_micros",
            "every node's duration is 0: the execution trace was converted without its "
            "Kineto trace; link them first (sim trace convert ET.json --kineto KINETO.json)",
        )
    gpu = any(o.on_gpu for o in ops.values())
    top: list[_Op] = []
    for r in roots:
        top += r.children if r.name in _ROOT_NAMES else [r]
    steps = [o for o in top if o.name.startswith("ProfilerStep#")]
    if steps:
        top = steps[0].children
    ranges = [o for op in top for o in op.walk() if o.name.startswith(RANGE_PREFIX)]
    backward = [o for op in top for o in op.walk() if o.name.startswith(_EVAL_PREFIX)]
    first_bwd = min((o.node.id for o in backward), default=None)
    left_out = ""
    groups: dict[str, list[_Op]] = {}
    if ranges:
        how = f"'{RANGE_PREFIX}' record_function ranges"
        for r in ranges:
            groups.setdefault(r.name[len(RANGE_PREFIX) :], []).append(r)
    else:
        how = "top-level forward operators recorded by autograd"
        forward = [
            o
            for o in top
            if (first_bwd is None or o.node.id < first_bwd)
            and not o.name.startswith(_EVAL_PREFIX)
            and any(x.seq >= 0 for x in o.walk())
        ]
        if forward:
            out_shapes = forward[-1].node.outputs.shapes.replace(" ", "")
            if out_shapes in ("[[]]", "[]") and len(forward) > 1:
                loss = [forward.pop()]
                # views taken for the loss (mse_loss's broadcast_tensors) are the loss's
                while len(forward) > 1 and _is_view(forward[-1]):
                    loss.insert(0, forward.pop())
                left_out = f"; the loss ({', '.join(o.name for o in loss)}) left out"
        for i, o in enumerate(forward):
            groups[f"{o.name.split('::')[-1]}{i}"] = [o]
    if not groups:
        raise TraceFormatError(
            src, "", "no forward operators found: not an execution trace of a training step"
        )
    seq_owner: dict[int, str] = {}
    for name, nodes in groups.items():
        for n in nodes:
            for x in n.walk():
                if x.seq >= 0:
                    seq_owner.setdefault(x.seq, name)
    bwd_us: dict[str, float] = {}
    param_bytes: dict[str, int] = {}
    last: str | None = None
    unattributed_us = 0.0
    elem = 0
    for ev in sorted(backward, key=lambda o: o.node.id):
        fn = next((c for c in ev.children if not c.name.startswith("aten::")), None)
        owner: str | None
        if _ACCUMULATE in ev.name:
            owner = last
            if owner is not None and fn is not None:
                nbytes, size = _tensor_bytes(fn.node.inputs.shapes, fn.node.inputs.types)
                param_bytes[owner] = param_bytes.get(owner, 0) + nbytes
                elem = elem or size
        else:
            owner = seq_owner.get(fn.seq) if fn is not None else None
            if owner is not None:
                last = owner
        if owner is None:
            unattributed_us += ev.inclusive_us(gpu)
        else:
            bwd_us[owner] = bwd_us.get(owner, 0.0) + ev.inclusive_us(gpu)
    layers: list[Layer] = []
    for name, nodes in groups.items():
        final = nodes[-1].children[-1] if ranges and nodes[-1].children else nodes[-1]
        act, size = _tensor_bytes(final.node.outputs.shapes, final.node.outputs.types)
        elem = elem or size
        layers.append(
            Layer(
                name=name,
                op=nodes[0].children[0].name if ranges and nodes[0].children else nodes[0].name,
                forward_s=sum(n.inclusive_us(gpu) for n in nodes) / 1e6,
                backward_s=bwd_us.get(name, 0.0) / 1e6,
                param_bytes=param_bytes.get(name, 0),
                activation_bytes=act,
            )
        )
    guessed = ""
    if batch_size is None:
        first = next(iter(groups.values()))[0]
        inner = first.children[0] if ranges and first.children else first
        try:
            shapes = ast.literal_eval(inner.node.inputs.shapes or "[]")
        except (ValueError, SyntaxError):
            shapes = []
        dims = [s[0] for s in shapes if isinstance(s, list) and s and isinstance(s[0], int)]
        if not dims or dims[0] <= 0:
            raise TraceFormatError(
                src, "", "the batch size cannot be read from the first layer's input; pass it"
            )
        batch_size = dims[0]
        guessed = f"; batch size {batch_size} read from the first layer's input"
    md = et.metadata
    meta = TraceMeta(
        model=os.path.basename(src).split(".")[0] or "chakra",
        device="cuda" if gpu else "cpu",
        batch_size=batch_size,
        dtype=_DTYPE_NAMES.get(elem, "float32"),
        framework=f"PyTorch (execution trace schema {md.get('schema', '?')})",
        date=str(md.get("time", ""))[:10],
        provenance=(
            f"imported from the Chakra execution trace {os.path.basename(src)} (converted "
            f"from a PyTorch run): layers from {how}; forward from their nodes' durations "
            f"({'GPU kernels' if gpu else 'CPU operators'}), "
            f"backward from autograd functions matched by sequence number; "
            f"{unattributed_us / 1e3:.3f} ms of backward outside every layer left out"
            f"{left_out}{guessed}"
        ),
        source_format="chakra",
    )
    return chain(meta, layers)


# ---- linking a PyTorch run's host and device traces -------------------------------------------


def is_host_trace(data: Any) -> bool:
    """Whether parsed JSON is a PyTorch execution trace (``ExecutionTraceObserver``'s
    output: ``schema`` and ``nodes``)."""
    return isinstance(data, dict) and "nodes" in data and "schema" in data


def _et_replay_importable() -> None:
    """chakra's linker imports ``et_replay``, which is not on the package index but ships
    inside HolisticTraceAnalysis (a dependency of mlc-chakra) as ``param_bench/et_replay``:
    make that importable under its own name."""
    import importlib.util
    import sys

    if importlib.util.find_spec("et_replay") is not None:
        return
    spec = importlib.util.find_spec("param_bench")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isdir(os.path.join(folder, "et_replay")):
            sys.path.append(folder)
            return
    raise ChakraMissing("linking a PyTorch execution trace (et_replay, from HolisticTraceAnalysis)")


def link_pytorch(host: str, device: str, out: str, *, rank: int = 0) -> None:
    """Link a PyTorch execution trace (``host``, JSON) with its Kineto trace (``device``)
    by chakra's ``chakra_trace_link`` and convert the result by ``chakra_converter
    PyTorch`` into the Chakra ET ``out``. :class:`TraceFormatError` naming the file that
    chakra's tools could not use."""
    import contextlib
    import io
    import json
    import logging
    import warnings

    schema("linking a PyTorch execution trace")
    for path, what in ((host, "PyTorch execution trace"), (device, "Kineto trace")):
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceFormatError(path, "", unreadable(exc)) from None
        except json.JSONDecodeError as exc:
            raise TraceFormatError(
                path, "", f"not valid JSON ({exc.msg}); expected a {what}"
            ) from None
        ok = (
            is_host_trace(data)
            if path == host
            else isinstance(data, dict) and "traceEvents" in data
        )
        if not ok:
            raise TraceFormatError(path, "", f"not a {what}")
    _et_replay_importable()
    from chakra.src.converter.pytorch_converter import PyTorchConverter
    from chakra.src.trace_link.trace_linker import TraceLinker

    logging.disable(logging.CRITICAL)  # chakra and HTA log to the root logger
    try:
        with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="dtsim-chakra-") as tmp:
            warnings.simplefilter("ignore")  # HTA's pandas deprecations
            linked = os.path.join(tmp, "linked.json")
            sink = io.StringIO()
            try:
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                    TraceLinker().link(rank, host, device, linked)
            except Exception as exc:
                raise TraceFormatError(
                    device,
                    "",
                    f"chakra_trace_link could not link it with {os.path.basename(host)} "
                    f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); record both "
                    "in the same run, with torch.profiler's schedule (ProfilerStep)",
                ) from None
            try:
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                    PyTorchConverter().convert(linked, out, False)
            except Exception as exc:
                raise TraceFormatError(
                    host,
                    "",
                    f"chakra_converter could not convert it ({type(exc).__name__}: "
                    f"{' '.join(str(exc).split())[:200]})",
                ) from None
    finally:
        logging.disable(logging.NOTSET)


def load_pytorch_pair(
    host: str, device: str, *, batch_size: int | None = None, model: str | None = None
) -> Trace:
    """The layer trace of a PyTorch run's execution trace ``host`` and Kineto trace
    ``device``, linked and converted by chakra's tools (:func:`link_pytorch`)."""
    with tempfile.TemporaryDirectory(prefix="dtsim-chakra-") as tmp:
        stem = os.path.basename(host).split(".")[0] or "pytorch"
        out = os.path.join(tmp, f"{stem}.0.et")
        link_pytorch(host, device, out)
        trace = load(out, batch_size=batch_size, model=model)
    from dataclasses import replace

    prov = trace.meta.provenance.replace(
        f"Chakra execution trace {os.path.basename(out)}",
        f"Chakra execution trace linked from {os.path.basename(host)} and "
        f"{os.path.basename(device)}",
    )
    return Trace(replace(trace.meta, provenance=prov), trace.layers, trace.edges)


def write_messages(path: str, metadata: Any, nodes: Iterable[Any]) -> None:
    """Write a Chakra ET: ``metadata`` then ``nodes``, each length-prefixed by chakra's
    encoder, to ``path`` (the caller makes it atomic)."""
    _pb, protolib = schema()
    with open(path, "wb") as fh:
        protolib.encodeMessage(fh, metadata)
        for node in nodes:
            protolib.encodeMessage(fh, node)
