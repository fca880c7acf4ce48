"""``p3``: priority-based parameter propagation (Jayarajan et al., "Priority-based
Parameter Propagation for Distributed DNN Training", SysML 2019).

The parameter-server structure of ``ps`` (:mod:`simcore.schemes._psbase`) with the
paper's changes:

* **Slicing.** Every parameter array (a layer's parameters) is cut into slices of at most
  ``slice_params`` parameters; an array smaller than that is one slice. The paper's text
  uses 50,000 parameters (our default); the reference code (anandj91/p3,
  ``MXNET_KVSTORE_SLICE_THRESHOLD``) defaults to 40,000.
* **Placement.** Slices are dealt to the servers round-robin. ``round_robin=global`` is
  what the reference code does: one counter runs over all slices of all arrays, in forward
  order, so the j-th slice overall goes to server ``j mod S`` and consecutive small arrays
  land on different servers. ``round_robin=per-key`` restarts the count for every array
  (slice i of an array on server ``i mod S``, a literal reading of the placement rule); it
  puts every array's first slice, and so every small array, on server 0.
* **Priority.** A slice's priority is the forward index of its layer (the first layer goes
  first); link queues at workers, switches and servers are priority queues
  (``priority_network``) and a chunk on the wire is never pre-empted, so the slice size
  bounds how long an urgent slice waits.
* **Fused push-pull.** A server answers each worker's push of a slice with the updated
  values once all workers' pushes of that slice are in; no acknowledgement or pull request.
* Sends and receives use both directions of every link at once (the network model is
  full duplex), and the next iteration's forward of a layer starts as soon as all of that
  layer's slices are back (see the base module).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from simcore.config import option
from simcore.schemes._psbase import MEAN_FIELD, ParameterServerScheme, ServerOptions, Shard
from simcore.work import SchemeWork, Workload

ROUND_ROBIN = ("global", "per-key")
"""How slices are dealt to servers (see module docs)."""


@dataclass(frozen=True)
class P3Options(ServerOptions):
    """Options of ``p3``."""

    slice_params: int = option(
        50_000, "parameters per slice (the paper: 50,000; the reference code: 40,000)", minimum=1
    )
    round_robin: str = option(
        "global",
        "slice placement: one round-robin counter over all "
        "slices (reference code) or restarted per array",
        choices=ROUND_ROBIN,
    )
    mean_field: str = option(
        "auto",
        "analytic fidelity: simulate two machines whose "
        "servers keep an equal share of every slice and mirror "
        "them onto the rest; auto: from 5 identical machines, "
        "on: wherever the cluster allows, off: every worker "
        "and server",
        choices=MEAN_FIELD,
    )


def p3_slices(
    layer_bytes: list[tuple[int, int]], servers: int, slice_bytes: int, round_robin: str = "global"
) -> list[Shard]:
    """The slices of ``(layer, param_bytes)`` arrays, given in forward order: each array is
    cut into pieces of ``slice_bytes`` (the last one shorter), dealt to ``servers`` servers
    round-robin (``global`` or ``per-key``, see module docs), with the layer's index as
    priority."""
    shards: list[Shard] = []
    counter = 0
    for layer, nbytes in layer_bytes:
        if round_robin == "per-key":
            counter = 0
        full, rest = divmod(nbytes, slice_bytes)
        sizes = [slice_bytes] * full + ([rest] if rest else [])
        for size in sizes:
            shards.append(Shard(layer, counter % servers, size, float(layer)))
            counter += 1
    return shards


class P3(ParameterServerScheme):
    """Priority-based parameter propagation (see module docs)."""

    name = "p3"
    summary = (
        "parameter servers with sliced, priority-ordered (first layer first) fused push-pull (P3)"
    )
    Options = P3Options
    fused = True
    priority_network = True
    real_runtime = "realrun.schemes.p3:P3Runtime"
    convergence_variants = MappingProxyType({"p3": {}})

    @classmethod
    def estimate_work(cls, work: Workload) -> SchemeWork:
        """A fused push and its answer for every slice per simulated worker and
        iteration (a mean field simulates two machines and sends each slice's share to
        both of their servers)."""
        mf = cls.estimated_mean_field(work)
        simulated = 2 * work.per_box if mf else work.gpus
        slice_bytes = max(1, work.options.slice_params * work.config.trace.dtype_bytes)
        slices = sum(-(-b // slice_bytes) for b in work.param_bytes)
        its = work.iterations
        return SchemeWork(
            messages=its * 2 * simulated * slices * (2 if mf else 1),
            moved_bytes=its * 2.0 * sum(work.param_bytes) * simulated,
            simulated_gpus=simulated,
            mean_field=mf,
        )

    def make_shards(self, num_servers: int) -> list[Shard]:
        trace = self.ctx.trace
        layers = [
            (i, layer.param_bytes)
            for i, layer in enumerate(trace.layers)
            if layer.param_bytes > 0 and layer.kind != "input"
        ]
        opts: P3Options = self.options
        return p3_slices(
            layers, num_servers, opts.slice_params * trace.dtype_bytes, opts.round_robin
        )

    def extra_metrics(self) -> dict[str, object]:
        out = super().extra_metrics()
        out["slice_bytes"] = self.options.slice_params * self.ctx.trace.dtype_bytes
        return out
