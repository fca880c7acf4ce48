"""Does a message handed to gloo arrive later when its sender computes right after the
``isend`` than when it sleeps?

Gloo ranks, one emulated host each (``--cluster netns``, shaped to ``--rate``; root
only) or all on loopback (``--cluster local``), one thread each, in one of two patterns:

- ``chain`` (default, 4 ranks): model parallelism's step. Each rank receives the
  activation from the one before (receives posted ahead), computes 0.7 ms, sends it on
  and waits for the gradient; the last computes and sends its gradient back; each rank
  that gets a gradient computes 0.8 ms, posts an ``isend`` of it to the rank before,
  then either spins 0.9 ms (``compute``: its optimizer step) or sleeps as long
  (``sleep``). Measured: every gradient hop, from the ``isend``'s return to the
  receiver's arrival.
- ``pair`` (2 ranks): both meet at a barrier, rank 0 computes 2 ms, posts an ``isend``
  to rank 1, then spins or sleeps 1.5 ms.

Printed per size and mode: from the ``isend``'s return to the arrival the median, mean,
90th percentile and the share over 0.5 ms (one machine's monotonic clock; negative when
the bytes arrived before the ``isend`` returned), and for ``chain`` the share per hop.
The first 10 messages are warm-up. A few seconds per row.

    python bench/isend_then_compute.py                      # chain, netns, 1 Gbit/s
    python bench/isend_then_compute.py --pattern pair --bytes 98304,262144 --messages 400
    python bench/isend_then_compute.py --pin 0,1,0,1        # rank i on core pin[i] (taskset)

``--pin`` puts each rank's process (its gloo threads too) on the given core, which tells
where a woken thread may run: with the last two ranks on different cores the receiver of
the last hop can always take the idle core; on the same core it never can.
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
"""Messages (or steps) left out of the statistics."""
RANKS = {"chain": 4, "pair": 2}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _after_send(mode: str, seconds: float) -> None:
    if mode == "compute":
        _spin(seconds)
    else:
        time.sleep(seconds)


def _summary(late: list[float]) -> str:
    return (
        f"median {statistics.median(late):.3f} ms, mean {statistics.fmean(late):.3f}, "
        f"p90 {sorted(late)[int(0.9 * len(late))]:.3f}, "
        f"over 0.5 ms {sum(x > 0.5 for x in late) / len(late):.0%}"
    )


def _pair(dist, rank: int, buf, mode: str, messages: int) -> list[float]:
    times = []
    for i in range(messages):
        dist.barrier()
        if rank == 0:
            _spin(0.002)
            work = dist.isend(buf, 1, tag=i)
            times.append(time.perf_counter())
            _after_send(mode, 0.0015)
            work.wait()
        else:
            dist.irecv(buf, 0, tag=i).wait()
            times.append(time.perf_counter())
    return times


def _chain(dist, rank: int, world: int, act, grad, mode: str, steps: int) -> list[float]:
    """Per step: when this rank's gradient ``isend`` returned (rank > 0) and when the
    gradient from the rank after arrived (rank < world - 1); nan where none."""
    nan = float("nan")
    sent, got = [], []
    for step in range(steps):
        works = []
        if rank > 0:
            dist.irecv(act, rank - 1, tag=2 * step).wait()
        _spin(0.0007)
        if rank < world - 1:
            works.append(dist.isend(act, rank + 1, tag=2 * step))
            dist.irecv(grad, rank + 1, tag=2 * step + 1).wait()
        got.append(time.perf_counter() if rank < world - 1 else nan)
        _spin(0.0008)
        if rank > 0:
            works.append(dist.isend(grad, rank - 1, tag=2 * step + 1))
        sent.append(time.perf_counter() if rank > 0 else nan)
        _after_send(mode, 0.0009)
        for work in works:
            work.wait()
    return sent + got


def rank_main(pattern: str, rank: int, nbytes: int, mode: str, messages: int) -> None:
    """One rank of the benchmark (run by the launcher below, with MASTER_ADDR/PORT set)."""
    import torch
    import torch.distributed as dist

    world = RANKS[pattern]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    buf, grad = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4)
    if pattern == "pair":
        times = _pair(dist, rank, buf, mode, messages)
    else:
        times = _chain(dist, rank, world, buf, grad, mode, messages)
    every = [torch.zeros(len(times), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, torch.tensor(times, dtype=torch.float64))
    if rank == 0:
        if pattern == "pair":
            late = [(every[1][i] - every[0][i]).item() * 1e3 for i in range(WARMUP, messages)]
            print(f"{nbytes:>9} {mode:8} return->arrival {_summary(late)}", flush=True)
        else:
            hops = {
                r: [
                    (every[r - 1][messages + i] - every[r][i]).item() * 1e3
                    for i in range(WARMUP, messages)
                ]
                for r in range(1, world)
            }
            late = [x for v in hops.values() for x in v]
            per_hop = ", ".join(
                f"{r}->{r - 1} {sum(x > 0.5 for x in v) / len(v):.0%}" for r, v in hops.items()
            )
            print(f"{nbytes:>9} {mode:8} gradient return->arrival {_summary(late)} "
                  f"(over 0.5 ms by hop: {per_hop})", flush=True)  # fmt: skip
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pattern", choices=tuple(RANKS), default="chain")
    ap.add_argument("--cluster", choices=("netns", "local"), default="netns")
    ap.add_argument("--rate", default="1Gbps", help="the netns links' rate (default 1Gbps)")
    ap.add_argument("--bytes", default="98304", help="message sizes, comma-separated")
    ap.add_argument("--messages", type=int, default=100, help="messages (chain: steps) per row")
    ap.add_argument("--pin", default="", help="a core per rank, comma-separated (taskset -c)")
    ap.add_argument("--rank", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        pattern, rank, nbytes, mode, messages = args.rank
        rank_main(pattern, int(rank), int(nbytes), mode, int(messages))
        return 0
    if args.messages <= WARMUP:
        ap.error(f"--messages must be more than {WARMUP}, got {args.messages}")
    sizes = [int(b) for b in args.bytes.split(",")]
    world = RANKS[args.pattern]
    pins = args.pin.split(",") if args.pin else []
    if pins and (len(pins) != world or not all(p.isdigit() for p in pins)):
        ap.error(f"--pin {args.pin!r}: expected {world} core numbers, comma-separated")
    me = [sys.executable, os.path.abspath(__file__), "--rank", args.pattern]

    def pinned(i: int, argv: list[str]) -> list[str]:
        return ["taskset", "-c", pins[i], *argv] if pins else argv

    port = 29800

    def row(nb: int, mode: str, command, env_of) -> None:
        procs = [
            subprocess.Popen(
                command(i, pinned(i, [*me, str(i), str(nb), mode, str(args.messages)])),
                env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", **env_of(i)},
            )
            for i in reversed(range(world))
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

    with EmulatedCluster(world, parse_rate(args.rate), prefix="dtbisend") as cluster:
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
