"""realrun.p2p.PostedLink: sends never hold the rank; the receive window gossip keeps."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="real runs need torch")

from realrun.runtime import BATCH, WEIGHTS, Recorder  # noqa: E402
from realrun.schemes.gossip import KEY_STRIDE, receive_window  # noqa: E402

MESSAGES = 8
WINDOW = 2
RECEIVER_LATE_S = 1.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, out: Any) -> None:
    """Rank 0 sends MESSAGES messages at once; rank 1 posts its receives only after
    RECEIVER_LATE_S, WINDOW at a time. Rank 0 reports how long its sends took and when
    its close returned; rank 1 what it received."""
    import torch.distributed as dist

    from realrun.p2p import PostedLink

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    group = dist.group.WORLD
    label = lambda kind, key: (f"m{key}", key)  # noqa: E731
    try:
        if rank == 0:
            link = PostedLink(0, 2, group, Recorder("r0"), iter(()), WINDOW, label, 30.0)
            t0 = time.monotonic()
            for key in range(MESSAGES):
                link.send(1, WEIGHTS, key, 0, torch.full((1 << 18,), float(key)))
            sent_s = time.monotonic() - t0
            link.close()
            out.put(("sender", sent_s, time.monotonic() - t0))
        else:
            time.sleep(RECEIVER_LATE_S)
            expected = ((0, WEIGHTS, k, 0, torch.empty(1 << 18)) for k in range(MESSAGES))
            link = PostedLink(1, 2, group, Recorder("r1"), expected, WINDOW, label, 30.0)
            got = [float(link.wait(WEIGHTS, k)[0]) for k in range(MESSAGES)]
            link.close()
            out.put(("receiver", got))
    finally:
        dist.destroy_process_group()


def test_a_send_returns_at_once_even_when_the_receiver_is_late():
    """Eight sends to a rank that posts its receives 1.5 s later, two at a time, return
    at once (a link that waited for the send ``window`` sends old held the sender until
    the receiver caught up); closing waits until every one has gone, and each arrives
    with its own contents."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((item[0], item[1:]) for item in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    sent_s, closed_s = results["sender"]
    assert sent_s < RECEIVER_LATE_S / 3
    assert closed_s >= RECEIVER_LATE_S * 0.8
    assert results["receiver"][0] == [float(k) for k in range(MESSAGES)]


class _Work:
    def wait(self, timeout: Any = None) -> None:
        return None


def test_gossip_posts_an_iteration_together_before_it_sends_its_model(monkeypatch):
    """Exchanging weights, a gossip worker mixes the partner's layers of iteration
    ``it - 1``, posts iteration ``it``'s receives (``post_through``), sends its own model
    of ``it``, then takes the batch of ``it - 1``. Every receive of ``it`` (the batch's
    too) is then posted by the time it sends, so no ready notice follows the model
    through the TCP stream, and none of ``it + 1``'s is, so no partner that is ahead
    pushes its next model into the link the worker is receiving on. The sliding window
    the runtime used before (layers plus two iterations' batches) posted the next
    iteration's first layers while the current ones were still due; one iteration's
    window does that too, a layer at a time, and leaves the batch unposted. Exchanging
    gradients the batch comes first and one iteration's window is kept."""
    from realrun import p2p

    monkeypatch.setattr(p2p.dist, "irecv", lambda *a, **k: _Work())
    layers, batches, iterations = 5, 2, 4
    count = {WEIGHTS: layers, BATCH: batches}

    def expected() -> Any:
        for it in range(iterations):
            for kind in (WEIGHTS, BATCH):  # the order the worker uses them (by weights)
                for i in range(count[kind]):
                    yield (1, kind, it * KEY_STRIDE + i, it, torch.empty(1))

    def posting(window: int | None) -> tuple[bool, bool]:
        """(every receive of ``it`` posted before the sends, none of ``it + 1`` posted
        while ``it - 1``'s layers were due), over the iterations."""
        label = lambda *a: ("m", 0)  # noqa: E731
        link = p2p.PostedLink(0, 2, None, Recorder("r0"), expected(), window, label, 1)
        if window is None:
            link.post_through(0)
        before_sends, not_early = True, True
        for it in range(1, iterations):
            for i in range(layers):
                not_early &= all(key // KEY_STRIDE < it for _k, key in link._posted)
                link.wait(WEIGHTS, (it - 1) * KEY_STRIDE + i)
            if window is None:
                link.post_through(it)  # GossipRuntime._mix's last step
            # the worker sends its model of ``it`` here
            wanted = {(k, it * KEY_STRIDE + i) for k in count for i in range(count[k])}
            before_sends &= wanted <= set(link._posted)
            for i in range(batches):
                link.wait(BATCH, (it - 1) * KEY_STRIDE + i)
        link.close(drain=True)
        return before_sends, not_early

    assert receive_window(layers, batches, by_weights=True) is None
    assert posting(None) == (True, True)
    assert posting(layers + 2 * batches) == (True, False)
    assert posting(layers + batches) == (False, False)
    assert receive_window(layers, batches, by_weights=False) == layers + batches


def test_a_link_without_a_window_posts_only_the_iterations_named(monkeypatch):
    """``window`` None: nothing is posted until ``post_through``, then exactly the
    expected messages of the iterations up to the one named; ``close`` refuses to finish
    with messages never posted, and drains them when asked."""
    from realrun import p2p

    monkeypatch.setattr(p2p.dist, "irecv", lambda *a, **k: _Work())
    label = lambda *a: ("m", 0)  # noqa: E731
    items = [
        (1, WEIGHTS, it * KEY_STRIDE + i, it, torch.empty(1)) for it in range(3) for i in range(2)
    ]
    link = p2p.PostedLink(0, 2, None, Recorder("r0"), iter(items), None, label, 1)
    assert link._posted == {}
    link.post_through(1)
    assert sorted(key for _k, key in link._posted) == [0, 1, KEY_STRIDE, KEY_STRIDE + 1]
    link.post_through(0)  # never goes back
    assert len(link._posted) == 4
    for it in range(2):
        for i in range(2):
            link.wait(WEIGHTS, it * KEY_STRIDE + i)
    assert link._posted == {}
    with pytest.raises(RuntimeError, match="never consumed"):
        link.close()
    link = p2p.PostedLink(0, 2, None, Recorder("r0"), iter(items), None, label, 1)
    link.close(drain=True)
    assert link._posted == {}
