"""What every rank of a real run shares: the model and its layers, the data, the loss,
span recording, and point-to-point messages with a priority send queue.

**Layers.** The model's layers are those of :func:`realrun.graph.layer_graph`, the same
names and order as the traces the profiler writes, so the simulator's bucket, shard and
slice layouts (computed on a trace) apply to the real parameters: a layer's parameters,
flattened in :attr:`~realrun.graph.LayerNode.param_names` order and concatenated, are the
"array" that the simulator's layer ``param_bytes`` stands for.

**Data.** Worker ``r``'s batch of iteration ``i`` is drawn from a generator seeded with
``(seed, r, i)`` (:func:`batch`); labels are drawn the same way; a job with a data set
reads it instead (:mod:`realrun.data`). A single process that
concatenates the workers' batches sees exactly the data of the distributed run.

**Messages** (:class:`Messenger`): every message is a 64-byte header (kind, key,
iteration, element count, sequence number) followed by a payload tensor unless it is a
control message. One sender thread per process takes messages from a priority queue
(lower first, FIFO among equals) and sends each whole before the next (a message on the
wire is never pre-empted); one receiver thread per peer reads headers and payloads in
order and hands them to a callback. gloo keeps the order of the messages of one tag
between two ranks, so no polling is needed. A payload travels under a tag of its own
(:func:`payload_tag`), and the receiver posts its receives ahead for the payloads a
scheme says it expects, and the next header's receive before it handles a message:
gloo sends a message only once the receiver has posted its buffer, and a receiver that
posts on demand makes every message wait for its ready notice, which travels in the
same TCP stream as the data going the other way (a parameter server's values, while
its workers push). Each messaging thread adds its own CPU seconds to the rank's record
(``messenger``), split into what it spent inside gloo's calls (``gloo_cpu_s``: sends,
waits for receives, and whatever network-stack work the kernel ran in the thread
meanwhile) and the rest (``cpu_s``: headers, queues, hand-overs; the callback's own CPU
is the scheme's work and left out), with the message ends it handled and their bytes:
the validation gives the simulator both as its cost per message.

**Clock.** Each rank's zero is the moment it leaves the start barrier. Ranks sharing the
cores of one machine leave it up to a few milliseconds apart (one of them may be waiting
for a core), so where every rank reads the same monotonic clock (one machine: local or
network namespaces, told apart by the kernel's boot id) the records are moved to the
earliest rank's zero before they are written (:meth:`Recorder.shift`), and times of
different ranks compare.
"""

from __future__ import annotations

import heapq
import itertools
import resource
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from realrun import emudevice
from realrun.graph import layer_graph, tensors_in
from realrun.job import Job
from realrun.machine import machine_cpu_s
from realrun.usermodel import ResolvedModel, resolve_model
from simcore.records import BACKWARD, COMPUTE, FORWARD, RECV, SEND

HEADER_WORDS = 8
"""int64 words of a message header: 64 bytes, the simulator's control message size."""

HEADER_BYTES = HEADER_WORDS * 8

HEADER_TAG = 0
"""The gloo tag of every message header."""

TAG_SPACE = 1 << 30
"""Tags wrap modulo this (gloo's tags are 32-bit; only messages in flight need differ)."""

KEY_STRIDE = 1 << 16
"""A payload's tag tells its iteration and key apart for keys below this."""

PUSH, VALUE, ACK, PULL, GRAD, BATCH, STOP, ACT, ACT_GRAD = 1, 2, 3, 4, 5, 6, 9, 10, 11
"""Message kinds (``ACT``/``ACT_GRAD``: a pipeline stage's boundary activation and its
gradient)."""

WEIGHTS = 12
"""Message kind: a layer's weights and optimizer state (gossip's exchange of weights)."""

KIND_NAMES = {
    PUSH: "push",
    VALUE: "pull",
    ACK: "ack",
    PULL: "pull request",
    GRAD: "grad",
    BATCH: "batch",
    STOP: "stop",
    ACT: "activation",
    ACT_GRAD: "activation grad",
    WEIGHTS: "weights",
}

WAIT = "wait"
"""Kind of a compute-stream span during which a rank waits for data (not busy)."""

BUSY_KINDS = frozenset({FORWARD, BACKWARD, "update", "aggregate"})
"""Compute-stream kinds that count as busy for utilisation."""


# ---- recording ---------------------------------------------------------------------------


class Recorder:
    """Spans (tuples in :class:`simcore.records.Span` field order) and byte counts of one
    rank, on the rank's clock (see module docs). Thread-safe for appends."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.t0 = time.monotonic()
        self.spans: list[tuple[Any, ...]] = []
        self.sent: list[tuple[int, int, int, str]] = []  # (dst rank, iteration, bytes, kind)
        self.header_bytes = 0
        self.iteration_end: dict[int, float] = {}
        self.cpu_at_end: dict[int, float] = {}
        """The process's CPU seconds (every thread) when it first marked an iteration
        done: what a rank costs the machine's cores, beyond its compute spans."""
        self.main_cpu_at_end: dict[int, float] = {}
        """The main thread's CPU seconds at the same moments: the work of the rank's
        compute stream, without the time it waited for a core."""
        self.machine_at_end: dict[int, list[float]] = {}
        """The machine's CPU seconds by state (:data:`realrun.machine.MACHINE_STATES`,
        from /proc/stat) at the same moments: what every process and the kernel took of
        the cores, the shaped links' soft interrupts counted apart; empty where there is
        no /proc/stat."""
        self._main_clock = time.pthread_getcpuclockid(threading.main_thread().ident or 0)
        self.on_span: Callable[[str], None] | None = None
        """Called with ``"KIND NAME"`` of every span recorded (the heartbeat's label)."""
        self._lock = threading.Lock()
        self.messenger = {
            "cpu_s": 0.0,
            "gloo_cpu_s": 0.0,
            "messages": 0,
            "bytes": 0,
            "process_cpu_s": 0.0,
            "main_cpu_s": 0.0,
            "handling_cpu_s": 0.0,
        }
        """What a :class:`Messenger` costs: its threads' CPU seconds outside gloo's calls
        (beyond the scheme's handling of what they received) and inside them, the message
        ends they handled (each message sent and each received) and those messages'
        bytes; and over the messenger's life, the whole process's CPU seconds (gloo's own
        threads included, which move the bytes of posted sends and receives), its main
        thread's and the receiving threads' handling of messages (the scheme's work)."""

    def start_clock(self) -> None:
        """Set this rank's zero to now."""
        self.t0 = time.monotonic()

    def now(self) -> float:
        """Seconds since this rank's zero."""
        return time.monotonic() - self.t0

    def shift(self, offset_s: float) -> None:
        """Move everything recorded ``offset_s`` later: onto a zero that many seconds
        earlier than this rank's."""
        if not offset_s:
            return
        with self._lock:
            self.t0 -= offset_s
            self.spans = [(*s[:4], s[4] + offset_s, s[5] + offset_s, *s[6:]) for s in self.spans]
            self.iteration_end = {k: v + offset_s for k, v in self.iteration_end.items()}

    def span(
        self,
        stream: str,
        kind: str,
        name: str,
        start: float,
        end: float,
        iteration: int = -1,
        layer: int = -1,
        nbytes: int = 0,
        flow: int = -1,
    ) -> None:
        """Record one span."""
        self.spans.append(
            (self.device, stream, kind, name, start, end, iteration, layer, -1, nbytes, flow)
        )
        if self.on_span is not None:
            self.on_span(f"{kind} {name}")

    def count_messenger(self, cpu_s: float, gloo_cpu_s: float, messages: int, nbytes: int) -> None:
        """Add a messaging thread's CPU seconds outside and inside gloo's calls, message
        ends and bytes."""
        with self._lock:
            m = self.messenger
            m["cpu_s"] += cpu_s
            m["gloo_cpu_s"] += gloo_cpu_s
            m["messages"] += messages
            m["bytes"] += nbytes

    def count_process(self, process_cpu_s: float, main_cpu_s: float, handling_cpu_s: float) -> None:
        """Add the process's and its main thread's CPU seconds over a messenger's life and
        the receiving threads' CPU seconds in the scheme's handlers."""
        with self._lock:
            m = self.messenger
            m["process_cpu_s"] += process_cpu_s
            m["main_cpu_s"] += main_cpu_s
            m["handling_cpu_s"] += handling_cpu_s

    def main_cpu_s(self) -> float:
        """The main thread's CPU seconds so far."""
        return time.clock_gettime(self._main_clock)

    def count_sent(self, dst: int, iteration: int, nbytes: int, kind: str) -> None:
        """Count ``nbytes`` of application data sent to rank ``dst``."""
        with self._lock:
            self.sent.append((dst, iteration, nbytes, kind))

    def end_iteration(self, iteration: int, t: float | None = None) -> None:
        """Mark this rank's part of ``iteration`` done (now, or at ``t`` if later than a
        mark already made)."""
        t = self.now() if t is None else t
        with self._lock:
            self.iteration_end[iteration] = max(t, self.iteration_end.get(iteration, 0.0))
            if iteration not in self.cpu_at_end:
                self.cpu_at_end[iteration] = time.process_time()
                self.main_cpu_at_end[iteration] = self.main_cpu_s()
                machine = machine_cpu_s()
                if machine is not None:
                    self.machine_at_end[iteration] = machine

    def record(self, **extra: Any) -> dict[str, Any]:
        """Everything recorded, as a JSON-able dictionary."""
        return {
            "device": self.device,
            "spans": [list(s) for s in self.spans],
            "sent": [list(s) for s in self.sent],
            "header_bytes": self.header_bytes,
            "iteration_end": {str(k): v for k, v in sorted(self.iteration_end.items())},
            "cpu_at_end": {str(k): v for k, v in sorted(self.cpu_at_end.items())},
            "main_cpu_at_end": {str(k): v for k, v in sorted(self.main_cpu_at_end.items())},
            "machine_at_end": {str(k): v for k, v in sorted(self.machine_at_end.items())},
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            **({"messenger": dict(self.messenger)} if self.messenger["messages"] else {}),
            **extra,
        }


# ---- model, layers, data ---------------------------------------------------------------------


@dataclass
class RealLayer:
    """A layer with parameters.

    Attributes:
        index: the layer's index in the trace (input layers included).
        name: its name in traces.
        params: its parameters, in the order their flattened values are concatenated.
        numel: elements of all of them.
        module: the module whose forward hooks mark the layer's forward (``None`` for
            parameters read directly by a functional op).
    """

    index: int
    name: str
    params: list[nn.Parameter]
    numel: int
    module: nn.Module | None

    def flat_grad(self) -> torch.Tensor:
        """The layer's gradients, flattened and concatenated (zeros where none)."""
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params
        ]
        return torch.cat(parts) if len(parts) > 1 else parts[0].clone()

    def flat_values(self) -> torch.Tensor:
        """The layer's parameter values, flattened and concatenated (a copy)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def load_flat(self, flat: torch.Tensor) -> None:
        """Copy ``flat`` (as :meth:`flat_values`) into the parameters."""
        off = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[off : off + n].view_as(p))
                off += n

    def set_grad(self, flat: torch.Tensor) -> None:
        """Set the parameters' gradients from ``flat``."""
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[off : off + n].view_as(p).clone()
            off += n


@dataclass
class ModelSetup:
    """A zoo model built for training, with its layers and trace-shaped description.

    Attributes:
        model: the module (on the compute device).
        layers: layers with parameters, in forward order.
        trace_layers: ``(name, param_bytes)`` of every trace layer (input layers too), in
            trace order: what the simulator's layouts are computed from.
        input_bytes: bytes of one batch of inputs.
        device: the compute device.
    """

    model: nn.Module
    layers: list[RealLayer]
    trace_layers: list[tuple[str, int, str]]
    input_bytes: int
    device: torch.device


def job_model(job: Job) -> ResolvedModel:
    """The model ``job`` names (a zoo model or the user's own, see
    :mod:`realrun.usermodel`)."""
    return resolve_model(job.model, job.input_shape)


def build_model(job: Job, device: torch.device) -> ModelSetup:
    """The zoo model of ``job`` with initial weights from ``job.seed`` (equal on every
    rank) and its layers (see module docs)."""
    resolved = job_model(job)
    torch.manual_seed(job.seed)
    model = resolved.build()
    with torch.device("meta"):
        meta_model = resolved.build()
    meta_inputs = resolved.example_inputs(job.batch_size, "meta")
    graph = layer_graph(meta_model, meta_inputs)
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    layers = []
    for i, node in enumerate(graph.layers):
        if not node.param_names or node.kind == "input":
            continue
        ps = [params[n] for n in node.param_names]
        module = modules.get(str(node.node.target)) if node.node.op == "call_module" else None
        layers.append(RealLayer(i, node.name, ps, sum(p.numel() for p in ps), module))
    trace_layers = [(n.name, n.param_bytes, n.kind) for n in graph.layers]
    input_bytes = sum(t.numel() * t.element_size() for t in meta_inputs)
    return ModelSetup(model.to(device), layers, trace_layers, input_bytes, device)


def _seed(job: Job, rank: int, iteration: int, salt: int) -> int:
    return ((job.seed * 1_000_003 + rank) * 1_000_033 + iteration) * 7 + salt


def batch(
    job: Job, rank: int, iteration: int, num_classes: int, label_shape: tuple[int, ...]
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Worker ``rank``'s inputs and labels of ``iteration`` (CPU; see module docs); a job
    with ``data`` takes them from that data set (:func:`realrun.data.batch`)."""
    if job.data:
        from realrun import data

        return data.batch(job, rank, iteration)
    inputs = job_model(job).example_inputs(job.batch_size, seed=_seed(job, rank, iteration, 1))
    gen = torch.Generator().manual_seed(_seed(job, rank, iteration, 2))
    labels = torch.randint(0, num_classes, (job.batch_size, *label_shape), generator=gen)
    return inputs, labels


_OUTPUT_SHAPES: dict[tuple[str, Any], tuple[int, tuple[int, ...]]] = {}


def output_shape(job: Job) -> tuple[int, tuple[int, ...]]:
    """``(classes, label shape per sample)`` of the model's (first) output, worked out on
    the meta device once per model (a pipeline's first stage asks every iteration)."""
    key = (job.model, job.input_shape)
    shape = _OUTPUT_SHAPES.get(key)
    if shape is None:
        resolved = job_model(job)
        with torch.device("meta"):
            m = resolved.build()
        out = next(iter(tensors_in(m(*resolved.example_inputs(1, "meta")))))
        shape = _OUTPUT_SHAPES[key] = (int(out.shape[-1]), tuple(int(s) for s in out.shape[1:-1]))
    return shape


def loss_of(output: Any, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every output shaped like the labels plus a class dimension of at
    least two classes (the mean over samples); any other output (a user model's scalar per
    sample, a last dimension of one) adds its mean square."""
    total: torch.Tensor | None = None
    for out in tensors_in(output):
        if not out.is_floating_point():
            continue
        if out.dim() and out.shape[-1] >= 2 and tuple(out.shape[:-1]) == tuple(labels.shape):
            term = F.cross_entropy(
                out.reshape(-1, out.shape[-1]).float(), labels.reshape(-1).to(out.device)
            )
        else:
            term = out.float().pow(2).mean()
        total = term if total is None else total + term
    if total is None:
        raise ValueError("the model produced no floating-point output to train on")
    return total


def make_optimizer(job: Job, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """``job.optimizer`` over ``params`` (``momentum`` is SGD with momentum
    ``job.momentum``, 0.9 unless set)."""
    if job.optimizer == "adam":
        return torch.optim.Adam(params, lr=job.lr, foreach=False)
    momentum = job.momentum if job.optimizer == "momentum" else 0.0
    return torch.optim.SGD(params, lr=job.lr, momentum=momentum, foreach=False)


# ---- hooks that time layers ------------------------------------------------------------------


class LayerTimer:
    """Forward spans per layer module (forward pre- and post-hooks, each rank's wait
    callback run first) and backward spans ending where each layer's gradients are
    complete (post-accumulate-grad hooks)."""

    def __init__(self, setup: ModelSetup, rec: Recorder, record_layers: bool) -> None:
        self.rec = rec
        self.record_layers = record_layers
        self.iteration = -1
        self.before_forward: Callable[[RealLayer], None] | None = None
        self.on_grad_ready: Callable[[RealLayer], None] | None = None
        self._fwd_start: dict[int, float] = {}
        self._pending: dict[int, int] = {}
        self._last_ready = 0.0
        self._ready: set[int] = set()
        self.layers = setup.layers
        for layer in setup.layers:
            if layer.module is not None:
                layer.module.register_forward_pre_hook(self._pre_hook(layer))
                layer.module.register_forward_hook(self._post_hook(layer))
            for p in layer.params:
                p.register_post_accumulate_grad_hook(self._grad_hook(layer))

    def start_forward(self, iteration: int) -> None:
        """Begin ``iteration``: the layers without a module get their wait now."""
        self.iteration = iteration
        self._ready.clear()
        self._pending = {layer.index: len(layer.params) for layer in self.layers}
        if self.before_forward is not None:
            for layer in self.layers:
                if layer.module is None:
                    self.before_forward(layer)

    def start_backward(self) -> None:
        """Backward begins now."""
        self._last_ready = self.rec.now()

    @property
    def last_grad_s(self) -> float:
        """When the latest layer's gradients were ready (the end of its backward span)."""
        return self._last_ready

    def finish_backward(self) -> list[RealLayer]:
        """After ``backward()``: the layers whose gradients never arrived (unused in this
        pass), now handed to ``on_grad_ready`` in backward order."""
        left = [layer for layer in reversed(self.layers) if layer.index not in self._ready]
        for layer in left:
            self._ready.add(layer.index)
            if self.on_grad_ready is not None:
                self.on_grad_ready(layer)
        return left

    def _pre_hook(self, layer: RealLayer) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any) -> None:
            if self.before_forward is not None:
                self.before_forward(layer)
            self._fwd_start[layer.index] = self.rec.now()

        return hook

    def _post_hook(self, layer: RealLayer) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, _out: Any) -> None:
            if self.record_layers:
                start = self._fwd_start.pop(layer.index, None)
                if start is not None:
                    self.rec.span(
                        COMPUTE,
                        FORWARD,
                        layer.name,
                        start,
                        self.rec.now(),
                        self.iteration,
                        layer.index,
                    )

        return hook

    def _grad_hook(self, layer: RealLayer) -> Callable[[torch.Tensor], None]:
        def hook(_p: torch.Tensor) -> None:
            left = self._pending.get(layer.index, 0) - 1
            self._pending[layer.index] = left
            if left == 0 and layer.index not in self._ready:
                self._ready.add(layer.index)
                now = self.rec.now()
                if self.record_layers:
                    self.rec.span(
                        COMPUTE,
                        BACKWARD,
                        layer.name,
                        self._last_ready,
                        now,
                        self.iteration,
                        layer.index,
                    )
                self._last_ready = now
                if self.on_grad_ready is not None:
                    self.on_grad_ready(layer)

        return hook


# ---- messages ----------------------------------------------------------------------------


def payload_tag(kind: int, key: int, iteration: int) -> int:
    """The gloo tag of the payload of message ``(kind, key, iteration)`` (never the
    header's)."""
    return 1 + ((iteration * KEY_STRIDE + key) * 16 + kind) % (TAG_SPACE - 1)


@dataclass
class Message:
    """One message to send: a header and an optional payload."""

    dst: int
    kind: int
    key: int
    iteration: int
    payload: torch.Tensor | None


Expected = tuple[int, int, int]
"""``(kind, key, iteration)`` of a payload a peer will send."""


class Messenger:
    """Point-to-point messages over a gloo process group (see module docs).

    ``on_message(src, kind, key, iteration, payload, arrived_s)`` runs on a receiver
    thread; ``buffer_for(src, kind, key)`` allocates the payload tensor of an incoming
    message (``None`` for control messages); ``label(kind, key)`` names a message and
    the trace layer it is about (``-1`` for none) in the timeline. ``expected(src)``
    yields the payload messages peer ``src`` will send, about in the order they come;
    up to ``window`` of them per peer have their receive posted ahead (a message that
    is not among them is received on demand).
    """

    def __init__(
        self,
        rank: int,
        world: int,
        peers: list[int],
        rec: Recorder,
        group: Any,
        on_message: Callable[..., None],
        buffer_for: Callable[[int, int, int], torch.Tensor | None],
        label: Callable[[int, int], tuple[str, int]] | None = None,
        expected: Callable[[int], Iterable[Expected]] | None = None,
        window: int = 0,
    ) -> None:
        self.rank, self.world, self.peers = rank, world, peers
        self.rec, self.group = rec, group
        self.on_message, self.buffer_for = on_message, buffer_for
        self.label = label or (lambda kind, _key: (KIND_NAMES.get(kind, "msg"), -1))
        self.expected, self.window = expected, window
        self._queue: list[tuple[float, int, Message]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._pair_seq: dict[tuple[int, int], itertools.count[int]] = {}
        self._error: BaseException | None = None
        self._cpu_at_start = (0.0, 0.0)
        self._handling_s = 0.0  # receiving threads' CPU in on_message (under _cond)
        self._sender = threading.Thread(target=self._send_loop, name="dtsim-send", daemon=True)
        self._receivers = [
            threading.Thread(target=self._recv_loop, args=(p,), name=f"dtsim-recv{p}", daemon=True)
            for p in peers
        ]

    def start(self) -> None:
        """Start the sender and receiver threads."""
        self._cpu_at_start = (time.process_time(), self.rec.main_cpu_s())
        self._sender.start()
        for t in self._receivers:
            t.start()

    def send(
        self,
        dst: int,
        kind: int,
        key: int,
        iteration: int,
        payload: torch.Tensor | None,
        priority: float = 0.0,
    ) -> None:
        """Queue a message (lower ``priority`` goes first; FIFO among equals; a payload
        waits for an emulated device's queued work, :func:`realrun.emudevice.sync`)."""
        if payload is not None:
            emudevice.sync()
        msg = Message(dst, kind, key, iteration, payload)
        with self._cond:
            heapq.heappush(self._queue, (priority, next(self._seq), msg))
            self._cond.notify()

    def close(self) -> None:
        """Send STOP to every peer after everything queued, then wait for the threads."""
        for p in self.peers:
            self.send(p, STOP, 0, -1, None, priority=float("inf"))
        self._sender.join()
        for t in self._receivers:
            t.join()
        process0, main0 = self._cpu_at_start
        self.rec.count_process(
            time.process_time() - process0, self.rec.main_cpu_s() - main0, self._handling_s
        )
        self.check()

    def check(self) -> None:
        """Re-raise an error of a messaging thread in the caller."""
        if self._error is not None:
            raise RuntimeError(f"messaging thread failed: {self._error!r}") from self._error

    def _flow(self, src: int, dst: int) -> int:
        counter = self._pair_seq.setdefault((src, dst), itertools.count())
        return ((src * self.world + dst) << 32) | next(counter)

    def _send_loop(self) -> None:
        try:
            stops = messages = total = 0
            gloo = _ThreadClock()
            while stops < len(self.peers):
                with self._cond:
                    while not self._queue:
                        self._cond.wait()
                    _prio, _seq, msg = heapq.heappop(self._queue)
                numel = msg.payload.numel() if msg.payload is not None else 0
                header = torch.tensor(
                    [msg.kind, msg.key, msg.iteration, numel, 0, 0, 0, 0], dtype=torch.int64
                )
                start = self.rec.now()
                with gloo:
                    dist.send(header, msg.dst, group=self.group, tag=HEADER_TAG)
                self.rec.header_bytes += HEADER_BYTES
                nbytes = 0
                if msg.payload is not None:
                    payload = msg.payload.contiguous()
                    tag = payload_tag(msg.kind, msg.key, msg.iteration)
                    with gloo:
                        dist.send(payload, msg.dst, group=self.group, tag=tag)
                    nbytes = payload.numel() * payload.element_size()
                if msg.kind == STOP:
                    stops += 1
                    continue
                counted = nbytes if msg.payload is not None else HEADER_BYTES
                messages += 1
                total += counted
                self.rec.count_sent(msg.dst, msg.iteration, counted, KIND_NAMES[msg.kind])
                name, layer = self.label(msg.kind, msg.key)
                self.rec.span(
                    SEND,
                    "send",
                    name,
                    start,
                    self.rec.now(),
                    msg.iteration,
                    layer,
                    counted,
                    self._flow(self.rank, msg.dst),
                )
            self.rec.count_messenger(
                time.thread_time() - gloo.total_s, gloo.total_s, messages, total
            )
        except BaseException as exc:  # surfaced by check()
            self._error = exc

    def _recv_loop(self, src: int) -> None:
        try:
            inbox = _PostedPayloads(self, src)
            headers = [torch.empty(HEADER_WORDS, dtype=torch.int64) for _ in range(2)]
            turn = 0
            messages = total = 0
            handling = 0.0  # CPU seconds in on_message: the scheme's work, not messaging
            gloo = inbox.gloo
            with gloo:
                work = dist.irecv(headers[turn], src, group=self.group, tag=HEADER_TAG)
            while True:
                with gloo:
                    work.wait()
                start = self.rec.now()
                kind, key, it, numel = (int(v) for v in headers[turn][:4])
                if kind == STOP:
                    inbox.finish()
                    own = time.thread_time() - handling - gloo.total_s
                    self.rec.count_messenger(own, gloo.total_s, messages, total)
                    with self._cond:
                        self._handling_s += handling
                    return
                turn ^= 1  # the next header may come while this message is handled
                with gloo:
                    work = dist.irecv(headers[turn], src, group=self.group, tag=HEADER_TAG)
                buf = inbox.receive(kind, key, it, numel) if numel else None
                end = self.rec.now()
                nbytes = buf.numel() * buf.element_size() if buf is not None else HEADER_BYTES
                name, layer = self.label(kind, key)
                self.rec.span(
                    RECV, "recv", name, start, end, it, layer, nbytes, self._flow(src, self.rank)
                )
                messages += 1
                total += nbytes
                c0 = time.thread_time()
                self.on_message(src, kind, key, it, buf, end)
                handling += time.thread_time() - c0
                inbox.top_up()
        except BaseException as exc:
            self._error = exc


class _ThreadClock:
    """Adds up the calling thread's CPU seconds spent inside ``with`` blocks."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.thread_time()

    def __exit__(self, *_exc: object) -> None:
        self.total_s += time.thread_time() - self._start


class _PostedPayloads:
    """A receiver thread's posted payload receives from one peer (see :class:`Messenger`)."""

    def __init__(self, messenger: Messenger, src: int) -> None:
        self.m, self.src = messenger, src
        self.gloo = _ThreadClock()  # the receiving thread's CPU inside gloo's calls
        self.posted: dict[Expected, tuple[Any, torch.Tensor]] = {}
        self.upcoming = iter(messenger.expected(src)) if messenger.expected else iter(())
        self.early: set[Expected] = set()  # expected ones that came before they were posted
        self.top_up()

    def top_up(self) -> None:
        """Post receives for the next expected payloads, up to the window."""
        m = self.m
        while len(self.posted) < m.window:
            nxt = next(self.upcoming, None)
            if nxt is None:
                return
            if nxt in self.early:
                self.early.discard(nxt)
                continue
            buf = m.buffer_for(self.src, nxt[0], nxt[1])
            if buf is None:
                raise RuntimeError(f"expected message {nxt} from rank {self.src} has no payload")
            with self.gloo:  # posting tells the sender it may go: a socket write
                work = dist.irecv(buf, self.src, group=m.group, tag=payload_tag(*nxt))
            self.posted[nxt] = (work, buf)

    def receive(self, kind: int, key: int, it: int, numel: int) -> torch.Tensor | None:
        """The payload of message ``(kind, key, it)`` of ``numel`` elements, received."""
        entry = self.posted.pop((kind, key, it), None)
        if entry is None:
            buf = self.m.buffer_for(self.src, kind, key)
            if buf is None:
                return None
            self._check(buf, kind, key, numel)
            with self.gloo:
                dist.recv(buf, self.src, group=self.m.group, tag=payload_tag(kind, key, it))
            if self.m.expected is not None:
                self.early.add((kind, key, it))
            return buf
        work, buf = entry
        self._check(buf, kind, key, numel)
        with self.gloo:
            work.wait()
        return buf

    def _check(self, buf: torch.Tensor, kind: int, key: int, numel: int) -> None:
        if buf.numel() != numel:
            raise RuntimeError(
                f"message kind {kind} key {key} from rank {self.src}: "
                f"{numel} elements, expected {buf.numel()}"
            )

    def finish(self) -> None:
        """The peer stopped: every posted receive must have been used."""
        if self.posted:
            raise RuntimeError(
                f"rank {self.src} stopped before sending {sorted(self.posted)[:3]} (expected)"
            )


class Slots:
    """Events keyed by anything, created on first use: one thread waits for a key, another
    sets it."""

    def __init__(self) -> None:
        self._events: dict[Any, threading.Event] = {}
        self._lock = threading.Lock()

    def _get(self, key: Any) -> threading.Event:
        with self._lock:
            ev = self._events.get(key)
            if ev is None:
                ev = self._events[key] = threading.Event()
            return ev

    def set(self, key: Any) -> None:
        """Mark ``key`` ready."""
        self._get(key).set()

    def wait(self, key: Any, check: Callable[[], None], timeout_s: float) -> None:
        """Wait for ``key``; ``check`` runs every second (it raises if a thread failed)."""
        ev = self._get(key)
        deadline = time.monotonic() + timeout_s
        while not ev.wait(1.0):
            check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:g} s for {key}")

    def discard(self, key: Any) -> None:
        """Forget ``key``."""
        with self._lock:
            self._events.pop(key, None)
