"""The benchmarks a calibration's ranks run (``python -m realrun.calibration.ranks
JOB.json``, one process per emulated host, with the environment ``torchrun`` would give
it).

Each rank reads the job (message sizes, repeats, the pairs to ping-pong, the steps in
order), joins a gloo process group, runs the steps (:func:`_rank_main`), reports progress
through rank 0's progress file, waits at the ``shape`` step while the parent shapes the
links, and writes its raw results as ``result<rank>.json``: ping-pong round trips and CPU
seconds, all-reduce times, the messenger's ping-pong, the two-flow benchmark's stamps,
the busy-cores all-reduces and rank 0's compute benchmarks. Only these processes import
torch.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from realrun.calibration import KiB, MiB
from realrun.calibration.fits import median
from realrun.machine import machine_busy_s
from simcore.units import format_bytes

__all__ = [
    "MESSENGER_SIZES_BYTES",
    "SHAPED_FILE",
    "SHAPE_LINE",
    "SHARING_BYTES",
    "SHARING_DELAYS",
    "WAKEUP_SIZES_BYTES",
    "element_count",
]

#: Sizes (bytes of one float32 array) of the reduction benchmark.
REDUCE_SIZES_BYTES: tuple[int, ...] = (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB)
#: Bytes of the tensor copied to measure memory bandwidth (well beyond the caches).
COPY_BYTES = 64 * MiB
#: Side of the square float32 matrices multiplied to measure the FLOP rate.
MATMUL_N = 512
MESSENGER_SIZES_BYTES = (1 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)
"""Payloads of the ping-pong through the runtime's messenger: the small ones show the
handshake, all of them the messenger's CPU per message and per byte (p3's slices are
about 200 KB, ps's shards a few MB)."""
#: Messages up to this size are repeated SMALL_FACTOR times as often (they take
#: microseconds, and a busy machine's scheduling noise needs more samples to average out).
SMALL_BYTES = 64 * KiB
SMALL_FACTOR = 4

ISEND_MESSAGES = 60
"""Rounds of the pipeline-message benchmark per size (each a message each way)."""
ISEND_WARMUP = 10
"""Its untimed first rounds."""

SHARING_BYTES = 2 * MiB
"""Each flow's message in the two-flow benchmark (a parameter server's shards are a few
MB): host 0 sends it to host 1 over two TCP connections, the second starting later."""
SHARING_DELAYS = (0.1, 0.25, 0.5)
"""When the second flow of the two-flow benchmark starts, as shares of the first's time on
the shaped link alone."""
SHARING_WARMUP = 3
"""Untimed rounds first: the connections' congestion windows open as in a training run."""
WAKEUP_SIZES_BYTES = (256 * KiB, 1 * MiB)
"""All-reduces of the busy-cores benchmark (a data-parallel run's buckets are a few
hundred KB to a few MB)."""
WAKEUP_REPEATS = 8
"""Timed all-reduces of the busy-cores benchmark per row, per ``--repeats``: a busy
machine's scheduling is noisy (with 4 the fitted wait ranged 1.35-1.8 ms over four
calibrations of one hour)."""
WAKEUP_PAUSE_S = 0.02
"""Idle time before each all-reduce of the busy-cores benchmark (the threads that carry it
go to sleep, as they do while a training step computes)."""
#: Rank 0's progress line asking the parent to shape the links, and the file in the
#: job's folder by which the parent says it has.
SHAPE_LINE = "#shape"
SHAPED_FILE = "shaped"


def element_count(n: int) -> int:
    """float32 elements of a message of about ``n`` bytes (at least one)."""
    return max(1, int(n) // 4)


def _rank_main(job_path: str) -> int:  # pragma: no cover - runs in the rank processes
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    with open(job_path, encoding="utf-8") as fh:
        job = json.load(fh)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out_dir = job["out"]
    progress = open(os.path.join(out_dir, "progress"), "a") if rank == 0 else None  # noqa: SIM115

    def step(what: str) -> None:
        if progress is not None:
            progress.write(what + "\n")
            progress.flush()

    def cpu_now() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    sizes = [int(n) for n in job["sizes"]]
    repeats = int(job["repeats"])
    result: dict[str, Any] = {"rank": rank, "torch": torch.__version__, "pingpong": [],
                              "allreduce": []}  # fmt: skip
    dist.barrier()

    def pingpong(tag: str) -> None:
        for a, b in job["pairs"]:
            for n in sizes:
                if rank in (a, b):
                    result["pingpong"].append(_pingpong(dist, torch, rank, a, b, n, repeats,
                                                        cpu_now, tag))  # fmt: skip
                dist.barrier()
                step(f"ping-pong {format_bytes(n)} h{a}-h{b}")

    def allreduce() -> None:
        for p in job["allreduce_ranks"]:
            group = dist.new_group(list(range(p)))
            for n in sizes:
                if rank < p:
                    buf = torch.ones(element_count(n), dtype=torch.float32)
                    dist.barrier(group)
                    dist.all_reduce(buf, group=group)  # warm-up
                    times = []
                    for _ in range(repeats):
                        dist.barrier(group)
                        t0 = time.perf_counter()
                        dist.all_reduce(buf, group=group)
                        times.append(time.perf_counter() - t0)
                    result["allreduce"].append(
                        {"ranks": p, "bytes": 4 * buf.numel(), "times_s": times}
                    )
                dist.barrier()
                step(f"all-reduce {format_bytes(n)} x{p}")

    for what in job["steps"]:
        kind, _, tag = what.partition(":")
        if kind == "pingpong":
            pingpong(tag)
        elif kind == "allreduce":
            allreduce()
        elif kind == "messenger":
            for n in MESSENGER_SIZES_BYTES:
                if rank in (0, 1):
                    row = _messenger_pingpong(
                        dist, torch, rank, world, n, repeats, tag == "busy", cpu_now
                    )
                    result.setdefault("messenger", []).append(
                        {
                            **row,
                            "busy": tag == "busy",
                            "shaped": tag != "unshaped" and "shape" in job["steps"],
                        }
                    )
                dist.barrier()
                step(f"messenger {format_bytes(n)} {tag or 'idle'}")
        elif kind == "isend":
            for n in MESSENGER_SIZES_BYTES:
                if rank in (0, 1):
                    row = _isend_beside_compute(dist, torch, rank, n, ISEND_MESSAGES)
                    result.setdefault("isend", []).append(
                        {**row, "shaped": "shape" in job["steps"]}
                    )
                dist.barrier()
                step(f"isend {format_bytes(n)} beside compute")
        elif kind == "sharing":
            if rank in (0, 1):
                result["sharing"] = _two_flows(
                    dist, torch, rank, SHARING_BYTES, job["sharing_delays_s"], repeats
                )
            dist.barrier()
            step("two flows")
        elif kind == "wakeup":
            pair = dist.new_group([0, 1])
            result["wakeup"] = _busy_allreduce(dist, torch, rank, world, pair, repeats)
            dist.barrier()
            step("all-reduce beside busy cores")
        elif kind == "compute":
            if rank == 0:
                result["compute"] = _compute_benchmarks(torch, step)
            dist.barrier()
        elif kind == "shape":
            # everybody idle while the parent shapes the links, then on together
            dist.barrier()
            step(SHAPE_LINE)
            shaped = os.path.join(out_dir, SHAPED_FILE)
            deadline = time.monotonic() + 60
            while not os.path.exists(shaped):
                if time.monotonic() > deadline:
                    raise RuntimeError("the links were not shaped within 60 s")
                time.sleep(0.01)
            dist.barrier()
        else:
            raise ValueError(f"unknown calibration step {what!r}")
    dist.destroy_process_group()
    tmp = os.path.join(out_dir, f"result{rank}.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, os.path.join(out_dir, f"result{rank}.json"))
    if progress is not None:
        progress.close()
    return 0


def _pingpong(
    dist: Any,
    torch: Any,
    rank: int,
    a: int,
    b: int,
    n: int,
    repeats: int,
    cpu_now: Callable[[], float],
    tag: str,
) -> dict[str, Any]:  # pragma: no cover - runs in the rank processes
    """One size of the ping-pong between ranks ``a`` (sends first) and ``b``: one warm-up,
    then the timed round trips, how long each blocking send of ``a`` took to return (the
    receive is posted: what the kernel did not take into the socket's send buffer had to
    go out first) and the CPU seconds this process spent on them."""
    buf = torch.zeros(element_count(n), dtype=torch.float32)
    peer = b if rank == a else a
    ping = rank == a

    def once() -> float:
        if ping:
            t0 = time.perf_counter()
            dist.send(buf, peer)
            returned = time.perf_counter() - t0
            dist.recv(buf, peer)
            return returned
        dist.recv(buf, peer)
        dist.send(buf, peer)
        return 0.0

    once()  # warm-up
    rts, returns = [], []
    reps = repeats * (SMALL_FACTOR if n <= SMALL_BYTES else 1)
    c0, m0 = cpu_now(), machine_busy_s()
    for _ in range(reps):
        t0 = time.perf_counter()
        returns.append(once())
        rts.append(time.perf_counter() - t0)
    cpu = cpu_now() - c0
    machine = machine_busy_s() - m0
    return {
        "machine_cpu_s": machine,
        "tag": tag,
        "pair": [a, b],
        "bytes": 4 * buf.numel(),
        "role": "ping" if ping else "pong",
        "round_trips_s": rts,
        "send_returns_s": returns,
        "cpu_s": cpu,
        "messages": 2 * reps,
    }


def _messenger_pingpong(
    dist: Any,
    torch: Any,
    rank: int,
    world: int,
    n: int,
    repeats: int,
    busy: bool = False,
    cpu_now: Callable[[], float] = time.process_time,
) -> dict[str, Any]:  # pragma: no cover - runs in the rank processes
    """Ping-pong of ``n``-byte messages between ranks 0 and 1 through the runtime's own
    :class:`~realrun.runtime.Messenger` (the path of ``ps`` and ``p3``: a sender
    thread, header then payload, a receiver thread per peer, payload receives posted
    ahead): one warm-up, then ``4 * repeats`` timed round trips on rank 0, and the CPU
    seconds rank 0's process (all its threads) spent on them."""
    import threading

    from realrun.runtime import ACT, Messenger, Recorder

    numel = element_count(n)
    buf = torch.zeros(numel)
    peer = 1 - rank
    reps = 4 * repeats + 1
    got = threading.Semaphore(0)
    seen = [0]
    done = threading.Event()

    def on_message(_src: int, _kind: int, key: int, it: int, _payload: Any, _at: float) -> None:
        if rank == 1:
            box[0].send(0, ACT, key, it, buf)
            seen[0] += 1
            if seen[0] == reps:
                done.set()
        else:
            got.release()

    box = [
        Messenger(
            rank, world, [peer], Recorder(f"r{rank}"), dist.group.WORLD, on_message,
            lambda _s, _k, _key: torch.empty(numel),
            expected=lambda _src: ((ACT, i, 0) for i in range(reps)), window=2,
        )
    ]  # fmt: skip
    box[0].start()
    rts: list[float] = []
    cpu = [0.0]
    # the main thread's own CPU clock, readable from the pinging thread: in the busy
    # ping-pong the process's CPU less the main thread's is what the messages cost
    main_clock = time.pthread_getcpuclockid(threading.main_thread().ident)
    main_cpu = [0.0]

    def ping() -> None:
        for i in range(reps):
            if i == 1:
                cpu[0] = -cpu_now()
                main_cpu[0] = -time.clock_gettime(main_clock)
            t0 = time.perf_counter()
            box[0].send(1, ACT, i, 0, buf)
            waited = 0
            while not got.acquire(timeout=1):
                box[0].check()  # a messaging thread's error, rather than a time-out
                waited += 1
                if waited == 60:
                    raise RuntimeError("the messenger ping-pong got no answer within 60 s")
            if i:
                rts.append(time.perf_counter() - t0)
        cpu[0] += cpu_now()
        main_cpu[0] += time.clock_gettime(main_clock)
        done.set()

    if busy:
        # the main thread trains meanwhile (small kernels with Python between them), as a
        # rank's does while its messenger threads carry the pipeline's messages
        if rank == 0:
            pinger = threading.Thread(target=ping)
            pinger.start()
        a = torch.rand(128, 128)
        while not done.is_set():
            for _ in range(20):
                a = torch.tanh(a @ a * 0.01)
        if rank == 0:
            pinger.join()
    elif rank == 0:
        ping()
    elif not done.wait(120):
        raise RuntimeError("the messenger ping-pong stopped before its last message")
    box[0].close()
    return {
        "bytes": 4 * numel,
        "role": "ping" if rank == 0 else "pong",
        "round_trips_s": rts,
        "cpu_s": cpu[0],
        "main_cpu_s": main_cpu[0],
        "messages": 2 * len(rts),
    }


def _isend_beside_compute(
    dist: Any, torch: Any, rank: int, n: int, count: int
) -> dict[str, Any]:  # pragma: no cover - runs in the rank processes
    """A pipeline's messages between ranks 0 and 1 while both compute: every receive
    posted ahead, then ``count`` rounds in which each rank computes about a millisecond
    (small matrix products), hands an ``n``-byte tensor to ``dist.isend`` on its main
    thread and waits for the peer's message of the round. The first
    :data:`ISEND_WARMUP` rounds are warm-up. Returns the main thread's CPU seconds in
    each timed ``isend`` call (what the call holds the rank for: writing the bytes, the
    soft interrupts that pass them on), and the process's CPU less the main thread's
    over the timed rounds per message end (sends and receives: gloo's threads)."""
    import threading

    peer = 1 - rank
    numel = element_count(n)
    out = torch.ones(numel)
    ins = [torch.empty(numel) for _ in range(count)]
    recvs = [dist.irecv(b, peer) for b in ins]
    a = torch.rand(128, 128)
    main = time.pthread_getcpuclockid(threading.main_thread().ident)
    calls: list[float] = []
    sends = []
    p0 = m0 = 0.0
    for i in range(count):
        if i == ISEND_WARMUP:
            p0, m0 = time.process_time(), time.clock_gettime(main)
        for _ in range(12):  # about a millisecond of compute
            a = torch.tanh(a @ a * 0.01)
        c0 = time.thread_time()
        sends.append(dist.isend(out, peer))
        if i >= ISEND_WARMUP:
            calls.append(time.thread_time() - c0)
        recvs[i].wait()
    off_main = (time.process_time() - p0) - (time.clock_gettime(main) - m0)
    for req in sends:
        req.wait()
    timed = count - ISEND_WARMUP
    return {
        "bytes": 4 * numel,
        "isend_cpu_s": median(calls),
        "off_main_cpu_s": off_main / (2 * timed),
        "messages": timed,
    }


def _two_flows(
    dist: Any, torch: Any, rank: int, nbytes: int, delays_s: Sequence[float], repeats: int
) -> dict[str, Any]:  # pragma: no cover - runs in the rank processes
    """The two-flow benchmark between ranks 0 and 1: rank 0 sends ``nbytes`` to rank 1 on
    each of two TCP connections per round, the second ``delay`` after the first, for each
    of ``delays_s`` ``repeats`` times after :data:`SHARING_WARMUP` rounds at the largest;
    rounds far enough apart that they never overlap. Rank 0 returns when each send
    started, rank 1 when each message's last byte came (``time.perf_counter``: one clock
    for every process of the machine)."""
    import socket
    import threading

    ser = max(delays_s) / max(SHARING_DELAYS)  # the first flow's time alone
    period = 2.5 * ser + 0.03
    # the delays take turns, so a stall of the machine spoils rounds of every delay, not
    # every repeat of one
    plan = [max(delays_s)] * SHARING_WARMUP + [d for _ in range(repeats) for d in delays_s]
    port = torch.zeros(1, dtype=torch.int64)
    listener = None
    if rank == 0:  # point to point: the other ranks are waiting at a barrier meanwhile
        listener = socket.create_server(("", 0))
        port[0] = listener.getsockname()[1]
        dist.send(port, 1)
    else:
        dist.recv(port, 0)
    conns: list[socket.socket] = []
    if rank == 1:
        for flow in range(2):
            c = socket.create_connection((os.environ["MASTER_ADDR"], int(port[0])))
            c.sendall(bytes([flow]))
            conns.append(c)
    else:
        assert listener is not None
        by_flow = {}
        for _ in range(2):
            c, _addr = listener.accept()
            by_flow[c.recv(1)[0]] = c
        listener.close()
        conns = [by_flow[0], by_flow[1]]
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stamps: list[list[float]] = [[], []]
    errors: list[BaseException] = []
    t0 = time.perf_counter() + 0.05  # rank 1 is connected and receiving by now

    def sender(flow: int) -> None:
        data = bytes(nbytes)
        for k, d in enumerate(plan):
            at = t0 + k * period + (d if flow else 0.0)
            while (left := at - time.perf_counter()) > 0:
                time.sleep(left - 0.001 if left > 0.002 else 0)
            stamps[flow].append(time.perf_counter())
            conns[flow].sendall(data)

    def receiver(flow: int) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        for _ in plan:
            got = 0
            while got < nbytes:
                n = conns[flow].recv_into(view[: min(len(buf), nbytes - got)])
                if n == 0:
                    raise RuntimeError("the two-flow benchmark's connection closed early")
                got += n
            stamps[flow].append(time.perf_counter())

    def guarded(flow: int) -> None:
        try:
            (sender if rank == 0 else receiver)(flow)
        except BaseException as err:  # re-raised in the rank's main thread below
            errors.append(err)
            for c in conns:  # unblock the other flow's thread
                c.close()

    threads = [threading.Thread(target=guarded, args=(f,)) for f in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    if errors:
        raise RuntimeError(f"the two-flow benchmark failed: {errors[0]!r}") from errors[0]
    key = "start_s" if rank == 0 else "done_s"
    return {"delays_s": plan, "warmup": SHARING_WARMUP, "first_" + key: stamps[0],
            "second_" + key: stamps[1]}  # fmt: skip


def _busy_allreduce(
    dist: Any, torch: Any, rank: int, world: int, pair: Any, repeats: int
) -> list[dict[str, Any]]:  # pragma: no cover - runs in the rank processes
    """Ranks 0 and 1 all-reduce each of :data:`WAKEUP_SIZES_BYTES` (``pair``: a group of
    the two), one warm-up and ``WAKEUP_REPEATS * repeats`` timed, beside ``t`` computing
    threads for ``t`` = 0 (idle) and 2 to ``world``: ranks 0 and 1's main threads and
    those of ranks 2 .. ``t - 1`` train a small convolution meanwhile (a data-parallel
    step's backward beside its buckets' all-reduce; the other ranks' for a window of
    three idle all-reduces' time). Each all-reduce starts :data:`WAKEUP_PAUSE_S` after a barrier and
    is timed from its start to its end as a thread waiting on it sees it. Returns rank
    0's rows (``bytes``, ``threads``, ``times_s``); the other ranks' are empty."""
    import threading

    conv = torch.nn.Conv2d(16, 16, 3, padding=1)
    x = torch.rand(4, 16, 32, 32)
    rows = []
    window = torch.zeros(1, dtype=torch.float64)
    for n in WAKEUP_SIZES_BYTES:
        buf = torch.ones(element_count(n))
        for threads in (0, *range(2, world + 1)):
            times = []
            for k in range(WAKEUP_REPEATS * repeats + 1):
                dist.barrier()
                time.sleep(WAKEUP_PAUSE_S)
                t0 = time.perf_counter()
                if rank < 2:
                    done: list[float] = []
                    work = dist.all_reduce(buf, group=pair, async_op=True)
                    waiter = threading.Thread(
                        target=lambda w=work, d=done: (w.wait(), d.append(time.perf_counter()))
                    )
                    waiter.start()
                    while threads and not done:
                        conv(x).sum().backward()
                    waiter.join()
                    if k:
                        times.append(done[0] - t0)
                elif rank < threads:
                    while time.perf_counter() - t0 < float(window[0]):
                        conv(x).sum().backward()
            if rank == 0:
                rows.append({"bytes": 4 * buf.numel(), "threads": threads, "times_s": times})
            if threads == 0:  # how long the other ranks compute beside this size
                if rank == 0:
                    window[0] = 3 * median(times) + 0.02
                dist.broadcast(window, 0)
    return rows


def _compute_benchmarks(
    torch: Any, step: Callable[[str], None]
) -> dict[str, Any]:  # pragma: no cover
    """One-thread float32 reductions, copies and matmuls on this rank (the others wait)."""
    reduce_rows = []
    for n in REDUCE_SIZES_BYTES:
        a = torch.rand(n // 4)
        b = torch.rand(n // 4)
        reps = max(3, min(200, (64 * MiB) // n))
        a.add_(b)  # warm-up
        per_call = []
        for _ in range(5):
            c0 = time.thread_time()
            for _ in range(reps):
                a.add_(b)
            per_call.append((time.thread_time() - c0) / reps)
        reduce_rows.append({"bytes": n, "cpu_s": median(per_call)})
    step("reduce")
    src = torch.rand(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    step("copy")
    x = torch.rand(MATMUL_N, MATMUL_N)
    y = torch.rand(MATMUL_N, MATMUL_N)
    torch.mm(x, y)
    mms = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(x, y)
        mms.append(time.perf_counter() - t0)
    step("matmul")
    return {
        "reduce": reduce_rows,
        "copy_bytes_per_s": COPY_BYTES / min(copies),
        "matmul_flops": 2 * MATMUL_N**3 / min(mms),
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_rank_main(sys.argv[1]))
