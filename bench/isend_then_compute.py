"""Does a message handed to gloo arrive later when its sender computes right after the
``isend`` than when it sleeps?

Two gloo ranks, one emulated host each (``--cluster netns``, shaped to ``--rate``; root
only) or both on loopback (``--cluster local``). Per message: both ranks meet at a
barrier, rank 0 computes 2 ms, posts an ``isend`` of ``--bytes`` to rank 1 (whose
receive is posted), then either spins for 1.5 ms (``compute``: a pipeline stage's
optimizer step after its last gradient) or sleeps as long (``sleep``: a stage that waits
for its next message). Rank 1 notes when its receive completes. Printed per size and
mode: how long the ``isend`` took, and from its return to the arrival the median, mean,
90th percentile and the share over 0.5 ms (the clocks are one machine's monotonic
clock). Each rank uses one thread; the first 10 messages are warm-up. About half a
minute per row.

    python bench/isend_then_compute.py                      # netns, 1 Gbit/s
    python bench/isend_then_compute.py --cluster local --bytes 98304 --messages 400
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WARMUP = 10
"""Messages left out of the statistics."""


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def rank_main(rank: int, nbytes: int, mode: str, messages: int) -> None:
    """One rank of the benchmark (run by the launcher below, with MASTER_ADDR/PORT set)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    buf = torch.zeros(nbytes // 4)
    times = []
    for i in range(messages):
        dist.barrier()
        if rank == 0:
            _spin(0.002)
            work = dist.isend(buf, 1, tag=i)
            returned = time.perf_counter()
            if mode == "compute":
                _spin(0.0015)
            else:
                time.sleep(0.0015)
            work.wait()
            times.append(returned)
        else:
            dist.irecv(buf, 0, tag=i).wait()
            times.append(time.perf_counter())
    both = [torch.zeros(messages, dtype=torch.float64) for _ in range(2)]
    dist.all_gather(both, torch.tensor(times, dtype=torch.float64))
    if rank == 0:
        late = [(both[1][i] - both[0][i]).item() * 1e3 for i in range(WARMUP, messages)]
        print(
            f"{nbytes:>9} {mode:8} return->arrival median {statistics.median(late):.3f} ms, "
            f"mean {statistics.fmean(late):.3f}, p90 {sorted(late)[int(0.9 * len(late))]:.3f}, "
            f"over 0.5 ms {sum(x > 0.5 for x in late) / len(late):.0%}",
            flush=True,
        )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", choices=("netns", "local"), default="netns")
    ap.add_argument("--rate", default="1Gbps", help="the netns links' rate (default 1Gbps)")
    ap.add_argument("--bytes", default="16384,65536,98304,131072,262144",
                    help="message sizes, comma-separated")  # fmt: skip
    ap.add_argument("--messages", type=int, default=200, help="messages per row")
    ap.add_argument(
        "--rank", nargs=4, metavar=("RANK", "BYTES", "MODE", "N"), help=argparse.SUPPRESS
    )
    args = ap.parse_args(argv)
    if args.rank:
        rank_main(int(args.rank[0]), int(args.rank[1]), args.rank[2], int(args.rank[3]))
        return 0
    if args.messages <= WARMUP:
        ap.error(f"--messages must be more than {WARMUP}, got {args.messages}")
    sizes = [int(b) for b in args.bytes.split(",")]
    me = [sys.executable, os.path.abspath(__file__)]
    port = 29800

    def row(nb: int, mode: str, command, env_of) -> None:
        procs = [
            subprocess.Popen(
                command(i, [*me, "--rank", str(i), str(nb), mode, str(args.messages)]),
                env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", **env_of(i)},
            )
            for i in (1, 0)
        ]
        for p in procs:
            p.wait()

    if args.cluster == "local":
        for nb in sizes:
            for mode in ("compute", "sleep"):
                port += 1
                env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
                row(nb, mode, lambda _i, argv: argv, lambda _i, env=env: env)
        return 0
    from realrun.netns import EmulatedCluster
    from simcore.units import parse_rate

    with EmulatedCluster(2, parse_rate(args.rate), prefix="dtbisend") as cluster:
        hosts = cluster.hosts
        for nb in sizes:
            for mode in ("compute", "sleep"):
                port += 1

                def env_of(i: int, port: int = port) -> dict[str, str]:
                    return {"GLOO_SOCKET_IFNAME": hosts[i].ifname,
                            "MASTER_ADDR": hosts[0].address, "MASTER_PORT": str(port)}  # fmt: skip

                row(nb, mode, cluster.command, env_of)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
