"""``p3`` for real: the parameter servers of :mod:`realrun.schemes.ps` with P3's changes.

* Shards are :func:`simcore.schemes.p3.p3_slices` of the model's layers: slices of at
  most ``slice_params`` parameters dealt to the servers round-robin (``round_robin``).
* Every send queue, a worker's and a server's, is ordered by priority, the slice's layer
  index (the first layer first); a slice on the wire is never pre-empted, since the
  sender thread sends one message whole before it takes the next.
* A push is answered by the updated values once all workers' pushes of the slice are in
  (no acknowledgement, no pull request).
"""

from __future__ import annotations

from realrun.schemes.ps import DTYPE_BYTES, PSRuntime
from simcore.schemes._psbase import Shard
from simcore.schemes.p3 import p3_slices


class P3Runtime(PSRuntime):
    """Priority-based parameter propagation (see module docs)."""

    fused = True

    def make_shards(self, layer_bytes: list[tuple[int, int]]) -> list[Shard]:
        opts = self.job.options
        return p3_slices(
            layer_bytes,
            self.S,
            int(opts.get("slice_params", 50_000)) * DTYPE_BYTES,
            str(opts.get("round_robin", "global")),
        )

    def priority(self, k: int) -> float:
        return self.shards[k].shard.priority
