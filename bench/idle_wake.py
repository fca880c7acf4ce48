"""How much later does a gloo message reach a thread that has waited idle for a while?

Two gloo ranks on loopback, one torch thread each: rank 0 sleeps ``gap`` seconds, then
sends ``--bytes`` to rank 1 (blocked in ``recv`` all that time) and waits for a 4-byte
reply; the round trip is timed from the send. With no gap the ranks ping-pong back to
back, as the calibration's ping-pong does; with a gap rank 1 (and the machine's cores)
has been idle that long. The round trip's growth with the gap is the lateness of a
thread woken after idling, which the simulator does not model yet (docs/validation.md,
nineteenth session). A few seconds per size.

    python bench/idle_wake.py                     # 96 KiB (an mp activation) and 4 B
    python bench/idle_wake.py --bytes 4 --gaps-ms 0,1,2,5,10,20 --messages 300
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PORT = 29611


def _rank(rank: int, nbytes: int, gaps_s: list[float], messages: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{PORT}")
    big, small = torch.zeros(max(1, nbytes // 4)), torch.zeros(1)
    for gap in gaps_s:
        rtts = []
        for i in range(messages + 5):  # 5 untimed first
            if rank == 0:
                if gap:
                    time.sleep(gap)
                t0 = time.perf_counter()
                dist.send(big, 1)
                dist.recv(small, 1)
                if i >= 5:
                    rtts.append(time.perf_counter() - t0)
            else:
                dist.recv(big, 0)
                dist.send(small, 0)
        if rank == 0:
            rtts.sort()
            med, mean = statistics.median(rtts) * 1e6, statistics.mean(rtts) * 1e6
            p90 = rtts[int(0.9 * len(rtts))] * 1e6
            print(
                f"{nbytes:>8} B  idle {gap * 1e3:5.1f} ms: round trip median {med:6.0f} us, "
                f"mean {mean:6.0f}, p90 {p90:6.0f}",
                flush=True,
            )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", default="98304,4", help="message sizes, comma-separated")
    ap.add_argument("--gaps-ms", default="0,0.5,2,5,10", help="idle times before a send")
    ap.add_argument("--messages", type=int, default=150, help="timed round trips per row")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        rank, nbytes, gaps, messages = args.child
        _rank(int(rank), int(nbytes), [float(g) for g in gaps.split(",")], int(messages))
        return
    gaps_s = ",".join(str(float(g) / 1e3) for g in args.gaps_ms.split(","))
    for nbytes in args.bytes.split(","):
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    str(r),
                    nbytes,
                    gaps_s,
                    str(args.messages),
                ]
            )
            for r in range(2)
        ]
        codes = [p.wait(timeout=600) for p in procs]
        if any(codes):
            sys.exit(f"a rank failed (exit statuses {codes})")


if __name__ == "__main__":
    main()
