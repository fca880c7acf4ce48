"""``ps``: parameter-server data parallelism, the P3 paper's MXNet baseline.

Per-layer keys: a layer's parameters are one array. Arrays of at least
``big_array_bytes`` (MXNet's bound of 1,000,000 elements, 4 MB of fp32) are split evenly
over all servers; smaller arrays go whole to one server chosen by a deterministic hash of
the key (``key * 9973 mod S``). Messages are sent in the order backward produces them
(FIFO, last layer first), with MXNet's push / acknowledgement / pull-request / value
protocol (see :mod:`simcore.schemes._psbase`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from simcore.config import option
from simcore.schemes._psbase import MEAN_FIELD, ParameterServerScheme, ServerOptions, Shard
from simcore.work import SchemeWork, Workload


@dataclass(frozen=True)
class PSOptions(ServerOptions):
    """Options of ``ps``."""

    big_array_bytes: int = option(
        4_000_000,
        "arrays at least this big are split over all servers (MXNet: 1e6 elements)",
        unit="bytes",
        minimum=1,
    )
    mean_field: str = option(
        "auto",
        "analytic fidelity: simulate two machines and mirror "
        "them onto the rest, every server keeping its real "
        "shards; auto: from 5 identical machines, on: wherever "
        "the cluster allows, off: every worker and server",
        choices=MEAN_FIELD,
    )


def mxnet_shards(
    layer_bytes: list[tuple[int, int]], servers: int, big_array_bytes: int, element_bytes: int = 4
) -> list[Shard]:
    """Shards of ``(layer, param_bytes)`` arrays under MXNet's placement rule; a split array
    is cut into whole elements of ``element_bytes`` (the first servers get one more
    element when they do not divide evenly)."""
    shards: list[Shard] = []
    for key, (layer, nbytes) in enumerate(layer_bytes):
        if nbytes >= big_array_bytes and servers > 1:
            q, rem = divmod(nbytes // element_bytes, servers)
            odd = nbytes % element_bytes  # bytes that make no whole element stay on server 0
            for s in range(servers):
                size = (q + (1 if s < rem else 0)) * element_bytes + (odd if s == 0 else 0)
                shards.append(Shard(layer, s, size))
        else:
            shards.append(Shard(layer, (key * 9973) % servers, nbytes))
    return shards


class ParameterServer(ParameterServerScheme):
    """MXNet-style parameter server (see module docs)."""

    name = "ps"
    summary = "parameter servers, per-layer push then pull in backward order (MXNet baseline)"
    Options = PSOptions
    fused = False
    keeps_placement = True
    real_runtime = "realrun.schemes.ps:PSRuntime"
    convergence_variants = MappingProxyType({"ps": {}})

    @classmethod
    def estimate_work(cls, work: Workload) -> SchemeWork:
        """Push, acknowledgement, pull request and value of every shard per simulated
        worker and iteration (arrays from ``big_array_bytes`` split over the servers; a
        mean field simulates two machines and folds a split array's parts)."""
        mf = cls.estimated_mean_field(work)
        simulated = 2 * work.per_box if mf else work.gpus
        params = work.param_bytes
        big = sum(1 for b in params if b >= work.options.big_array_bytes)
        servers = work.options.servers or work.boxes
        shards = (len(params) + big) if mf else (len(params) - big + big * servers)
        its = work.iterations
        return SchemeWork(
            messages=its * 4 * simulated * shards,
            moved_bytes=its * 2.0 * sum(params) * simulated,
            simulated_gpus=simulated,
            mean_field=mf,
        )

    def make_shards(self, num_servers: int) -> list[Shard]:
        layers = [
            (i, layer.param_bytes)
            for i, layer in enumerate(self.ctx.trace.layers)
            if layer.param_bytes > 0 and layer.kind != "input"
        ]
        return mxnet_shards(
            layers, num_servers, self.options.big_array_bytes, self.ctx.trace.dtype_bytes
        )
