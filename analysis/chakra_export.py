"""A run's span records as Chakra execution traces: one ``NAME.RANK.et`` per rank.

Works from what any run records (:class:`~simcore.records.Span` tuples: ``sim run``'s and
``sim real``'s alike), written with ``mlc-chakra``'s schema and encoder
(:mod:`traces.chakra`). Ranks are the run's devices, the workers first (``device_names``),
then the others (parameter servers) in order of appearance.

Nodes, per rank in the order they started:

* **compute** (``COMP_NODE``): one per span of the compute stream (a layer's forward or
  backward pass per micro-batch, an update, an aggregation), ``duration_micros`` its
  length; layer passes carry the layer's name, index, op, parameter and activation bytes,
  FLOPs (``num_ops``) and inputs from the run's trace, and every node its pass, iteration,
  micro-batch and exact seconds (``dtsim.*`` attributes), so that :func:`traces.chakra.load`
  gets the layer trace back.
* **point-to-point** (``COMM_SEND_NODE`` / ``COMM_RECV_NODE``): one per message end, with
  ``comm_size`` (bytes), the peer's rank (``comm_dst`` / ``comm_src``) and a tag shared by
  the two ends (``comm_tag``).
* **collective** (``COMM_COLL_NODE``): one per span of the collective stream (an all-reduce
  of a bucket), with ``comm_type``, ``comm_size`` and the communicator (``pg_name``: a key of
  ``comm_groups.json`` beside the files, mapping it to its ranks, the layout ASTRA-sim's
  ``--comm-group-configuration`` reads). The messages the simulator walked inside it are
  not written again.

Dependencies (``data_deps``) order a rank's nodes as the run did, and only as much as it
had to: a compute node waits for the compute node before it and for every message
received or collective finished since that one started (the pipeline schedule's
activations and gradients, a parameter server's pulled slices); a collective for the one
before it on its stream, the last compute finished before it started (the bucket's last
backward) and what was received since; a send for the last compute, receive and
collective finished before it started (the layer or slice it carries); a receive for the
last compute and collective finished before it was posted. A dependency always finished
before its dependant started, so the graph is acyclic.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simcore.records import COMM, COMPUTE, RECV, SEND, STREAMS
from traces.chakra import DTSIM_FORMAT, RANK_FILE, schema, write_messages
from traces.model import Trace

_EPS_S = 1e-12
_LAYER_PASSES = ("forward", "backward", "recompute")


@dataclass(frozen=True)
class RunInfo:
    """What the exported files say about the run (global metadata ``dtsim.*``).

    Attributes:
        model: model name.
        batch_size: samples per replica per iteration (the layer times' batch).
        device: the device the compute times are for (the simulated GPU model, or the
            machine the real run measured on).
        scheme: the training scheme.
        warmup_iterations: iterations before the measured ones (the importer reads the
            first measured one).
        iterations: measured iterations.
        iteration_time_s: the run's mean iteration time.
        source: how the run was made (``simulated by dtsim 0.1.0``...).
        dtype: element type of parameters and activations.
        framework: what produced the times.
        microbatches: micro-batches per iteration (pipelines; 1 otherwise).
    """

    model: str
    batch_size: int
    device: str
    scheme: str
    warmup_iterations: int
    iterations: int
    iteration_time_s: float
    source: str
    dtype: str = "float32"
    framework: str = ""
    microbatches: int = 1


def _collective_type(pb: Any, kind: str, label: str = "") -> int:
    """Chakra's ``CollectiveCommType`` for a collective span's kind (``allreduce-ring``),
    else its label (a ``ring-half`` is a reduce-scatter or an all-gather, tagged so)."""
    for name in (kind, label):
        found = _named_collective(pb, name)
        if found is not None:
            return found
    raise ValueError(f"no Chakra collective type for {kind!r} ({label!r})")


def _named_collective(pb: Any, name: str) -> int | None:
    """The ``CollectiveCommType`` whose name ``name`` starts with, if any."""
    k = name.replace("_", "").replace("-", "").lower()
    for key, value in (
        ("allreduce", pb.ALL_REDUCE),
        ("reducescatter", pb.REDUCE_SCATTER),
        ("allgather", pb.ALL_GATHER),
        ("alltoall", pb.ALL_TO_ALL),
        ("broadcast", pb.BROADCAST),
        ("barrier", pb.BARRIER),
        ("gather", pb.GATHER),
        ("scatter", pb.SCATTER),
        ("reduce", pb.REDUCE),
    ):
        if k.startswith(key):
            return value
    return None


def _attr(pb: Any, name: str, value: Any) -> Any:
    """An ``AttributeProto`` of the natural kind for ``value``."""
    if isinstance(value, bool):
        return pb.AttributeProto(name=name, bool_val=value)
    if isinstance(value, int):
        return pb.AttributeProto(name=name, int64_val=value)
    if isinstance(value, float):
        return pb.AttributeProto(name=name, double_val=value)
    if isinstance(value, list | tuple):
        return pb.AttributeProto(name=name, string_list=pb.StringList(values=list(value)))
    return pb.AttributeProto(name=name, string_val=str(value))


def rank_order(spans: Sequence[Sequence[Any]], device_names: Sequence[str]) -> list[str]:
    """The devices as ranks: ``device_names`` first, then the others as they appear."""
    ranks = list(device_names)
    seen = set(ranks)
    for s in spans:
        if s[0] not in seen:
            seen.add(s[0])
            ranks.append(s[0])
    return ranks


def build(
    spans: Sequence[Sequence[Any]],
    device_names: Sequence[str],
    info: RunInfo,
    trace: Trace | None = None,
) -> tuple[list[tuple[Any, list[Any]]], dict[str, list[int]]]:
    """The ETs of a run: per rank ``(global metadata, nodes)``, and the communicators
    (``pg_name`` -> ranks). ``trace`` is the run's layer trace (the spans' layer indices
    refer to it), for the layers' sizes; without it layer passes carry their names only."""
    pb, _ = schema("--chakra-out")
    ranks = rank_order(spans, device_names)
    rank_of = {d: i for i, d in enumerate(ranks)}
    spans = [tuple(s) for s in spans]
    # Which device each message's two ends are on.
    ends: dict[int, dict[str, str]] = {}
    for s in spans:
        if s[1] in (SEND, RECV) and s[10] >= 0:
            ends.setdefault(s[10], {})[s[1]] = s[0]
    # Collectives: communicators, and the messages walked inside them.
    colls = [s for s in spans if s[1] == COMM]
    members: dict[tuple[str, str, int], set[int]] = {}
    for s in colls:
        members.setdefault((s[2], s[3], s[6]), set()).add(rank_of[s[0]])
    groups: dict[tuple[int, ...], str] = {}
    for key in sorted(members, key=lambda k: (k[2], k[1], k[0])):
        groups.setdefault(tuple(sorted(members[key])), str(len(groups) + 1))
    inside: dict[str, list[tuple[float, float, str, int]]] = {}
    for s in colls:
        inside.setdefault(s[0], []).append((s[4], s[5], s[3], s[6]))

    def in_collective(s: tuple[Any, ...]) -> bool:
        return any(
            a - _EPS_S <= s[4] and s[5] <= b + _EPS_S and s[3] == name and s[6] == it
            for a, b, name, it in inside.get(s[0], ())
        )

    tags = {f: i for i, f in enumerate(sorted(ends))}  # flow ids (real runs': 64-bit) -> int32
    msg_spans: dict[int, list[tuple[Any, ...]]] = {}
    for s in spans:
        if s[1] in (SEND, RECV) and s[10] >= 0:
            msg_spans.setdefault(s[10], []).append(s)
    walked = {
        f
        for f, e in ends.items()
        if colls and SEND in e and RECV in e and all(in_collective(s) for s in msg_spans[f])
    }

    layers = trace.layers if trace is not None else ()
    preds = trace.predecessors if trace is not None else ()
    inputs = [  # data-loading nodes: no rank runs them, so they are told in the metadata
        {
            "name": lay.name,
            "op": lay.op,
            "forward_s": lay.forward_s,
            "activation_bytes": lay.activation_bytes,
            "successors": [layers[j].name for j in trace.successors[i]],
        }
        for i, lay in enumerate(layers)
        if lay.kind == "input" and trace is not None
    ]
    by_device: dict[str, list[tuple[Any, ...]]] = {d: [] for d in ranks}
    for s in spans:
        if s[1] in (SEND, RECV) and s[10] in walked:
            continue
        by_device[s[0]].append(s)

    out: list[tuple[Any, list[Any]]] = []
    for rank, dev in enumerate(ranks):
        mine = sorted(
            by_device[dev],
            key=lambda s: (s[4], s[5], STREAMS.index(s[1]) if s[1] in STREAMS else 9),
        )
        nodes: list[Any] = []
        # Per stream: (end_s, order, node id), sorted by end, for the dependency look-ups.
        done: dict[str, list[tuple[float, int, int]]] = {st: [] for st in STREAMS}
        prev_start: dict[str, float] = {}
        prev_id: dict[str, int] = {}
        for order, s in enumerate(mine):
            _dev, stream, kind, label, start, end, it, layer, mb, nbytes, flow = s
            node = pb.Node(id=order)
            node.start_time_micros = max(0, round(start * 1e6))
            node.duration_micros = max(0, round((end - start) * 1e6))
            extra: dict[str, Any] = {"dtsim.iteration": int(it)}
            if stream == COMPUTE:
                extra.update({"dtsim.pass": kind, "dtsim.duration_s": float(end - start)})
                if mb >= 0:
                    extra["dtsim.microbatch"] = int(mb)
                node.type = pb.COMP_NODE
                node.name = f"{label or kind} {kind}" + (f" mb{mb}" if mb >= 0 else "")
                node.attr.append(_attr(pb, "is_cpu_op", False))
                if 0 <= layer < len(layers) and kind in _LAYER_PASSES:
                    lay = layers[layer]
                    extra.update(
                        {
                            "dtsim.layer": lay.name,
                            "dtsim.layer_index": int(layer),
                            "dtsim.op": lay.op,
                            "dtsim.kind": lay.kind,
                            "dtsim.param_bytes": int(lay.param_bytes),
                            "dtsim.activation_bytes": int(lay.activation_bytes),
                            "dtsim.inputs": [layers[p].name for p in preds[layer]],
                        }
                    )
                    if lay.flops is not None:
                        extra["dtsim.flops"] = float(lay.flops)
                        if kind == "forward":
                            node.attr.append(_attr(pb, "num_ops", int(lay.flops)))
                elif layer >= 0 and kind in _LAYER_PASSES:
                    extra.update({"dtsim.layer": label, "dtsim.layer_index": int(layer)})
            elif stream == COMM:
                node.type = pb.COMM_COLL_NODE
                node.name = f"{kind} {label}"
                node.attr.extend(
                    [
                        _attr(pb, "comm_type", _collective_type(pb, kind, label)),
                        _attr(pb, "comm_size", int(nbytes)),
                        _attr(pb, "pg_name", groups[tuple(sorted(members[(kind, label, it)]))]),
                    ]
                )
            else:
                peer_dev = ends.get(flow, {}).get(RECV if stream == SEND else SEND)
                peer = rank_of.get(peer_dev, -1) if peer_dev is not None else -1
                node.type = pb.COMM_SEND_NODE if stream == SEND else pb.COMM_RECV_NODE
                arrow = "->" if stream == SEND else "<-"
                node.name = f"{stream} {label} {arrow} {peer}"
                node.attr.extend(
                    [
                        pb.AttributeProto(
                            name="comm_dst" if stream == SEND else "comm_src", int32_val=peer
                        ),
                        pb.AttributeProto(name="comm_tag", int32_val=tags.get(flow, -1)),
                        _attr(pb, "comm_size", int(nbytes)),
                    ]
                )
            node.attr.extend(_attr(pb, k, v) for k, v in extra.items())
            for dep in _deps(stream, start, order, done, prev_start, prev_id):
                node.data_deps.append(dep)
            nodes.append(node)
            if stream in done:
                bisect.insort(done[stream], (end, order, order))
            prev_start[stream], prev_id[stream] = start, order
        meta = pb.GlobalMetadata(version="0.0.4")
        for k, v in {
            "schema": "1.0.2-chakra.0.0.4",
            "dtsim.format": DTSIM_FORMAT,
            "dtsim.rank": rank,
            "dtsim.world_size": len(ranks),
            "dtsim.node_count": len(nodes),
            "dtsim.device_name": dev,
            "dtsim.model": info.model,
            "dtsim.batch_size": int(info.batch_size),
            "dtsim.dtype": info.dtype,
            "dtsim.device": info.device,
            "dtsim.framework": info.framework,
            "dtsim.scheme": info.scheme,
            "dtsim.warmup_iterations": int(info.warmup_iterations),
            "dtsim.iterations": int(info.iterations),
            "dtsim.iteration_time_s": float(info.iteration_time_s),
            "dtsim.source": info.source,
            "dtsim.microbatches": int(info.microbatches),
            "dtsim.input_layers": json.dumps(inputs),
        }.items():
            meta.attr.append(_attr(pb, k, v))
        out.append((meta, nodes))
    return out, {name: list(r) for r, name in groups.items()}


def _latest(done: list[tuple[float, int, int]], t: float, order: int) -> int | None:
    """The node that finished last at or before ``t`` among those before ``order``."""
    i = bisect.bisect_right(done, (t + _EPS_S, float("inf"), 0))
    while i > 0:
        i -= 1
        if done[i][1] < order:
            return done[i][2]
    return None


def _since(done: list[tuple[float, int, int]], a: float, t: float, order: int) -> list[int]:
    """The nodes that finished in ``(a, t]`` among those before ``order``."""
    lo = bisect.bisect_right(done, (a + _EPS_S, float("inf"), 0))
    hi = bisect.bisect_right(done, (t + _EPS_S, float("inf"), 0))
    return [n for _e, o, n in done[lo:hi] if o < order]


def _deps(
    stream: str,
    start: float,
    order: int,
    done: dict[str, list[tuple[float, int, int]]],
    prev_start: dict[str, float],
    prev_id: dict[str, int],
) -> list[int]:
    """The data dependencies of a node (see the module docs)."""
    deps: list[int | None] = []
    if stream in (COMPUTE, COMM):
        deps.append(prev_id.get(stream))
        since = prev_start.get(stream, float("-inf"))
        waited = [RECV] if stream == COMM else [RECV, COMM]
        for st in waited:
            deps += _since(done[st], since, start, order)
        if stream == COMM:
            deps.append(_latest(done[COMPUTE], start, order))
    else:
        for st in (COMPUTE, COMM) if stream == RECV else (COMPUTE, RECV, COMM):
            deps.append(_latest(done[st], start, order))
    return sorted({d for d in deps if d is not None})


def write(
    directory: str,
    name: str,
    spans: Sequence[Sequence[Any]],
    device_names: Sequence[str],
    info: RunInfo,
    trace: Trace | None = None,
) -> list[str]:
    """Write the run's ETs into ``directory`` (created if missing) as ``NAME.RANK.et``,
    and its communicators as ``comm_groups.json``; the files appear together once all are
    written (temporary files renamed), and files of an earlier, larger set of the same
    ``NAME`` are removed. Returns the paths written, by rank."""
    ets, groups = build(spans, device_names, info, trace)
    os.makedirs(directory, exist_ok=True)
    final = [os.path.join(directory, f"{name}.{r}.et") for r in range(len(ets))]
    temps: list[str] = []
    try:
        for path, (meta, nodes) in zip(final, ets):
            tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
            temps.append(tmp)
            write_messages(tmp, meta, nodes)
        groups_tmp = os.path.join(directory, f".comm_groups.json.tmp-{os.getpid()}")
        temps.append(groups_tmp)
        with open(groups_tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(groups, indent=1) + "\n")
        for tmp, path in zip(temps, [*final, os.path.join(directory, "comm_groups.json")]):
            os.replace(tmp, path)
    finally:
        for tmp in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)
    for entry in os.listdir(directory):
        m = RANK_FILE.match(entry)
        if m and m["name"] == name and int(m["rank"]) >= len(ets):
            os.unlink(os.path.join(directory, entry))
    return final
