"""The pipeline schemes (``mp``, ``gpipe``, ``pipedream``, ``spectrain``, ``1f1b``,
``zb-h1``, and the virtual-stage schemes ``interleaved``, ``looped-bfs``,
``zb-interleaved``, ``zbv``, ``dualpipev``) for real: one runtime that executes the
simulator's :class:`~simcore.schedule.Schedule`.

**Virtual stages.** A rank may run several stages (the schedule's placement): it keeps a
module, weights, optimizer, gradient sums, weight version and kept micro-batches per
stage and makes an action's stage the current one before running it
(:meth:`PipelineRuntime._use`). Messages are keyed by the receiving stage; between two
stages on the same rank (a V's turn) the outputs and input gradients are handed over in
memory, as the schedule has no send for them.

**Plan** (:func:`realrun.job.pipeline_of`, made once by ``sim real`` or a test and
stored in the job): the simulator scheme's own
:meth:`~simcore.schemes._pipeline.PipelineScheme.plan`, the partition ``sim run`` makes,
on an analytic trace of the real model (same layer names and order as
:func:`realrun.graph.layer_graph`): the stages' trace layer indices, their replica counts
and the micro-batches per iteration. Every rank splits the model
along it (:mod:`realrun.stages`) and builds the schedule with the simulator scheme's own
``make_schedule``: the very action lists ``sim run`` executes.

**Data.** Micro-batch ``m`` is chunk ``m mod M`` of ``batch(job, 0, m // M)``: the
pipeline's mini-batch is ``batch_size`` samples split into ``M`` micro-batches. Stage 0
makes its inputs, the last stage its labels; nothing else travels but activations and
their gradients.

**Actions** (each rank runs its list in order):

* ``F``: the stage's forward on the micro-batch (its input tensors become leaves that
  require grad; the output, or on the last stage the loss, is kept for the backward);
* ``SA``/``SG``: the boundary tensors (:class:`realrun.stages.Crossing`, one message each)
  leave with gloo's ``isend`` (:class:`realrun.p2p.PostedLink`): sends never block the
  rank (blocking sends deadlock in 1F1B); ``RA``/``RG`` wait for receives the rank
  posted ahead, since its action list names every message it will get;
* ``B``: ``torch.autograd.grad`` of the kept output with the received gradients, with
  respect to the stage's inputs and the weights its pass used; weight gradients add up
  in place until the next ``U`` (the sum is timed as part of the backward: allocating a
  new sum per micro-batch cost gpipe ~2 ms an iteration on ``mlp_medium``);
* ``I``/``W`` (the zero-bubble split, ``zb-h1``): ``I`` takes ``torch.autograd.grad`` of
  the kept output with respect to the stage's inputs only, keeping the graph, and the
  gradients leave with the next ``SG``; ``W`` later takes the gradients with respect to
  the weights from the same graph and output gradients and adds them up as ``B`` does;
  the micro-batch's saved activations are released at ``W``;
* ``R``: re-run the forward (``gpipe`` with ``recompute``: ``F`` then ran without
  autograd and kept only the stage input);
* ``U``: the optimizer step with the summed gradients (the stage's version goes up);
* ``AR``: the replicas of a stage average their gradients (gloo all-reduce on a group of
  the stage's ranks);
* ``L``: the backward uses the stashed version of the forward (checked and recorded);
* ``P``: the next pass uses SpecTrain's predicted weights.

**Weights of a pass.** ``mp``/``gpipe``: the parameters themselves (no update between a
micro-batch's forward and backward); the loss is scaled by ``1/M`` so that an iteration's
summed gradient is the mini-batch's. ``pipedream`` with ``stash``: the forward runs with
``torch.func.functional_call`` on a detached copy of the current weights (one copy per
version, shared by the micro-batches that use it, dropped when none does) and the backward
takes gradients with respect to that copy: exactly the forward's weights. Without
``stash`` (vanilla pipelining) and for ``spectrain`` the backward uses other weights than
the forward (the current ones, or a new prediction), so the backward re-runs the stage's
forward from the kept input with those weights and differentiates that (on an emulated
device it differentiates the forward's graph, as a GPU implementation would: no re-run,
whose time the simulator does not charge either). ``spectrain``'s
predicted weights are ``W - s * lr * v`` with ``v`` the optimizer's momentum buffer and
``s`` :func:`~simcore.schedule.version_difference`. Every pass records the weight version
it used (``passes`` in the rank's record: ``[mb, kind, version]``, a prediction counting
as the version it predicts).

**Memory** (per rank, in the record): ``stash_peak_bytes`` (weight copies of versions
other than the current one held at once) and ``activation_peak_bytes``: the peak over
the run of the bytes the micro-batches in flight keep for their backward (or ``W``
pass), their stage inputs and what the stage's layers keep. With real compute that is
what autograd saves (saved-tensor hooks, each storage once, the weights left out); on an
emulated device, the trace's activation bytes of the layers that ran, as a GPU running
the trace would hold them (the simulator's ``activation_peak_bytes``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from realrun import emudevice
from realrun.job import real_scheme, scheme_options
from realrun.p2p import Expected, PostedLink
from realrun.runtime import (
    ACT,
    ACT_GRAD,
    WAIT,
    Recorder,
    batch,
    job_model,
    loss_of,
    make_optimizer,
    output_shape,
)
from realrun.stages import SavedBytes, StageModule, split_model
from simcore import schedule as sch
from simcore.collectives import ring_bytes_sent
from simcore.records import BACKWARD, COMM, COMPUTE, FORWARD, PREDICT, RECOMPUTE, UPDATE
from traces.emulated import is_emulated_ref

KEY_STRIDE = 1024
"""Message key: ``micro-batch * KEY_STRIDE + index of the boundary tensor``."""


# ---- the schedule -----------------------------------------------------------------------------


def make_schedule(
    scheme: str,
    options: Mapping[str, Any],
    replicas: Sequence[int],
    microbatches: int,
    iterations: int,
) -> sch.Schedule:
    """The simulator scheme's schedule for these stages (``make_schedule`` of its class;
    with virtual stages, ``replicas`` has one entry per stage and the scheme places them)."""
    cls, opts = real_scheme(scheme), scheme_options(scheme, options)
    return cls.make_schedule(cls.stage_ranks(opts, replicas), microbatches, iterations, opts)


def features(scheme: str, options: Mapping[str, Any]) -> Any:
    """The scheme's :class:`~simcore.schemes._pipeline.PipelineFeatures` with its options."""
    return real_scheme(scheme).features.for_options(scheme_options(scheme, options))


def prescribed_versions(schedule: sch.Schedule, rank: int) -> list[tuple[int, str, int]]:
    """``(mb, kind, version)`` of every forward and backward of ``rank`` as the schedule
    prescribes: the updates before the pass (before the forward, for a backward after a
    ``L``), plus the :func:`~simcore.schedule.version_difference` of a predicted pass."""
    n = len(schedule.stages)
    updates: dict[int, int] = {}
    at_forward: dict[tuple[int, int], int] = {}
    load = predict = False
    out = []
    for a in schedule.actions[rank]:
        if a.kind == sch.UPDATE:
            updates[a.stage] = updates.get(a.stage, 0) + 1
        elif a.kind == sch.LOAD:
            load = True
        elif a.kind == sch.PREDICT:
            predict = True
        elif a.kind in (sch.FORWARD, sch.BACKWARD, sch.INPUT_GRAD, sch.WEIGHT_GRAD):
            fwd = a.kind == sch.FORWARD
            v = at_forward[(a.stage, a.mb)] if (load and not fwd) else updates.get(a.stage, 0)
            if predict:
                v += sch.version_difference(a.stage, n, fwd)
            if fwd:
                at_forward[(a.stage, a.mb)] = v
            out.append((a.mb, a.kind, v))
            load = predict = False
    return out


def pass_seed(job: Any, mb: int, stage: int) -> int:
    """The random seed of every pass of micro-batch ``mb`` at ``stage``: a re-run forward
    (recompute, a backward on other weights) draws the same dropout masks as the forward,
    and the replay draws the distributed run's."""
    return ((job.seed * 1_000_003 + mb) * 1_009 + stage) % (1 << 62)


def _next_pass(actions: Sequence[sch.Action], i: int) -> str | None:
    """The kind of the first pass after action ``i`` (a prediction's pass), or ``None``
    when an update or all-reduce comes first (the weights change before it)."""
    for a in actions[i + 1 :]:
        if a.kind in sch.PASS_KINDS:
            return a.kind
        if a.kind in (sch.UPDATE, sch.ALLREDUCE):
            return None
    return None


def seed_pass(seed: int, device: torch.device) -> None:
    """Seed the random numbers of one pass (dropout) on ``device``: the CPU generator
    alone, and the device's, not ``torch.manual_seed``, which also asks every other
    accelerator backend for a lazy seed and formats a stack trace for it each call."""
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def microbatch(job: Any, m: int, microbatches: int, cache: dict[int, Any]) -> Any:
    """Inputs and labels of micro-batch ``m`` (see module docs); ``cache`` keeps the
    current iteration's batch."""
    it = m // microbatches
    if it not in cache:
        cache.clear()
        cache[it] = batch(job, 0, it, *output_shape(job))
    inputs, labels = cache[it]
    j = m % microbatches
    size = job.batch_size // microbatches
    sl = slice(j * size, (j + 1) * size)
    return tuple(t[sl].contiguous() for t in inputs), labels[sl].contiguous()


# ---- the runtime -------------------------------------------------------------------------------


def accumulate(
    sums: list[torch.Tensor | None], grads: Sequence[torch.Tensor | None], add: bool = True
) -> None:
    """Add one micro-batch's weight gradients into ``sums`` in place (no allocation per
    micro-batch); a sum starts as the gradient itself, or a copy of it where autograd
    handed the same tensor to two weights (``a + b`` gives both one gradient). With
    ``add`` false a sum stays the first gradient (an emulated device's gradients carry
    no values, and a GPU would sum them on the device, not on the host's CPU)."""
    started: set[int] = set()
    for i, g in enumerate(grads):
        if g is None:
            continue
        total = sums[i]
        if total is None:
            ptr = g.untyped_storage().data_ptr()
            sums[i] = g.detach().clone() if ptr in started else g.detach()
            started.add(ptr)
        elif add:
            total.add_(g)


def _per_input(
    x: Sequence[torch.Tensor], got: Sequence[torch.Tensor | None]
) -> list[torch.Tensor | None]:
    """The gradient to send back for each stage input: ``got`` in order for the inputs
    that require one (zeros where the outputs do not depend on it), ``None`` for the
    others."""
    it_x = iter(got)
    out: list[torch.Tensor | None] = []
    for t in x:
        if t.requires_grad:
            g = next(it_x)
            out.append(torch.zeros_like(t) if g is None else g)
        else:
            out.append(None)
    return out


class PipelineRuntime:
    """One rank of a pipeline scheme (see module docs)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.job = job = ctx.job
        self.rec: Recorder = ctx.rec
        self.rank = ctx.rank
        pipe = job.pipeline
        self.M = int(pipe["microbatches"])
        self.tail = int(pipe.get("tail", 0))
        self.feat = features(job.scheme, job.options)
        self.schedule = make_schedule(
            job.scheme, job.options, pipe["replicas"], self.M, job.total_iterations + self.tail
        )
        self.local = self.schedule.local_stages()[self.rank]
        self.rank_of = [ranks[0] for ranks in self.schedule.stages]
        self.stage = self.local[0]
        self.n_stages = len(self.schedule.stages)
        micro = job.batch_size // self.M
        split = split_model(
            ctx.setup.model, pipe["stage_layers"], job_model(job).example_inputs(micro, "meta")
        )
        self.mods: dict[int, StageModule] = {s: split.stages[s] for s in self.local}
        self.mod: StageModule = self.mods[self.stage]
        self.params = self.mod.stage_parameters()
        self.names = self.mod.param_names
        self.optimizer = make_optimizer(job, self.params) if self.params else None
        self.async_ = not self.feat.flush
        self.scale = 1.0 if self.async_ else 1.0 / self.M
        self.group = None
        for ranks in self.schedule.stages:  # every rank creates every group, in order
            if len(ranks) > 1:
                g = dist.new_group(list(ranks), backend="gloo")
                if self.rank in ranks:
                    self.group = g
        self.replicas = len(self.schedule.stages[self.stage])
        self.inbox: dict[tuple[int, int, int, int], torch.Tensor] = {}
        # every message the rank receives is in its action list: receives are posted ahead
        per_mb = sum(len(m.inputs) + len(m.outputs or ()) for m in self.mods.values())
        self.link = PostedLink(
            self.rank,
            job.world_size,
            ctx.group,
            self.rec,
            self._expected(),
            2 * max(1, per_mb) * (self.M + self.n_stages),
            self._label,
            job.timeout_s * 4,
        )
        self.version = 0
        self.kept: dict[int, dict[str, Any]] = {}
        self.stash: dict[int, dict[str, torch.Tensor]] = {}
        self.stash_users: dict[int, int] = {}
        self.grads: list[torch.Tensor | None] = [None] * len(self.params)
        self.passes: list[list[int | str]] = []
        self.chunks: dict[int, dict[str, Any]] = {}
        for s in self.local[1:]:  # the other stages this rank runs (virtual stages)
            params = self.mods[s].stage_parameters()
            self.chunks[s] = {
                "mod": self.mods[s],
                "params": params,
                "names": self.mods[s].param_names,
                "optimizer": make_optimizer(job, params) if params else None,
                "grads": [None] * len(params),
                "version": 0,
                "kept": {},
            }
        self.losses: list[list[float]] = []  # last stage: [mb, loss] per forward
        self.stash_peak = 0
        self.act_held = 0
        self.act_peak = 0
        self.data: dict[int, Any] = {}
        self._predict_next = False
        self._prediction: tuple[dict[str, torch.Tensor], int] | None = None
        self._predicted_bufs: list[torch.Tensor] | None = None
        self._load_next = False
        self._out_grads: dict[int, list[torch.Tensor]] = {}
        # a GPU's or an emulated device's layers run after the host has moved on: one span
        # per pass, ending when the device's queue has (:func:`realrun.emudevice.sync`)
        self.record_layers = (
            job.record_layers and ctx.setup.device.type != "cuda" and not is_emulated_ref(job.model)
        )
        self.emulated = is_emulated_ref(job.model)
        """On an emulated device a backward on other weights than the forward's (SpecTrain,
        vanilla pipelining) differentiates the forward's graph, as a GPU implementation
        does, instead of re-running the forward (values carry no meaning there)."""
        self._fwd_marks: list[Any] = []
        self._grad_marks: list[Any] = []
        self.epoch_iterations = 0
        self.epoch_weights: dict[int, dict[str, torch.Tensor]] = {}
        if job.data:
            from realrun import data

            self.epoch_iterations = data.updates_per_epoch(job)

    # ---- messages --------------------------------------------------------------------
    def _expected(self) -> Iterator[Expected]:
        """The messages this rank receives, in the order its actions consume them."""
        for a in self.schedule.actions[self.rank]:
            it = self.schedule.iteration_of(a)
            mod = self.mods[a.stage]
            if a.kind == sch.RECV_ACT:
                for j, c in enumerate(mod.inputs):
                    buf = torch.empty(c.shape, dtype=c.dtype)
                    yield a.peer, ACT, self._key(a.stage, a.mb, j), it, buf
            elif a.kind == sch.RECV_GRAD:
                for j, c in enumerate(mod.outputs or ()):
                    if c.differentiable:
                        buf = torch.empty(c.shape, dtype=c.dtype)
                        yield a.peer, ACT_GRAD, self._key(a.stage, a.mb, j), it, buf

    def _key(self, stage: int, mb: int, j: int) -> int:
        """The message key of boundary tensor ``j`` of micro-batch ``mb`` for ``stage``
        (the receiving stage)."""
        return (mb * self.n_stages + stage) * KEY_STRIDE + j

    def _label(self, kind: int, key: int) -> tuple[str, int]:
        what = "act" if kind == ACT else "grad"
        mb, stage = divmod(key // KEY_STRIDE, self.n_stages)
        suffix = f" stage{stage}" if len(self.local) > 1 else ""
        return f"{what} mb{mb}.{key % KEY_STRIDE}{suffix}", -1

    def _take(self, kind: int, mb: int, j: int) -> torch.Tensor:
        return self.inbox.pop((kind, self.stage, mb, j))

    def _receive(self, kind: int, mb: int, j: int) -> None:
        key = self._key(self.stage, mb, j)
        self.inbox[(kind, self.stage, mb, j)] = self.link.wait(kind, key)

    _CHUNK_STATE = ("mod", "params", "names", "optimizer", "grads", "version", "kept")
    """What a rank keeps per stage it runs (see :meth:`_use`)."""

    def _use(self, stage: int) -> None:
        """Make ``stage`` the current one: its module, weights, optimizer, gradient sums,
        version and kept micro-batches (a rank with virtual stages switches between
        them; one with a single stage never does)."""
        if stage == self.stage:
            return
        self.chunks[self.stage] = {k: getattr(self, k) for k in self._CHUNK_STATE}
        for k, v in self.chunks.pop(stage).items():
            setattr(self, k, v)
        self.stage = stage

    # ---- weights -----------------------------------------------------------------------
    def _current(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.params))

    def _predicted(self, forward: bool) -> tuple[dict[str, torch.Tensor], int]:
        """SpecTrain's predicted weights, written into the one prediction buffer the stage
        keeps (a pass's graph is gone before the next prediction): one fused pass per
        weight, no allocation (allocating two weight-sized temporaries per prediction
        took ~1.4 ms instead of ~0.3 on a 1 MB stage of ``cnn_medium``)."""
        s = sch.version_difference(self.stage, self.n_stages, forward)
        lr = self.job.lr
        if self._predicted_bufs is None:
            self._predicted_bufs = [torch.empty_like(p).requires_grad_() for p in self.params]
        with torch.no_grad():
            for w, p in zip(self._predicted_bufs, self.params):
                v = (
                    self.optimizer.state.get(p, {}).get("momentum_buffer")
                    if self.optimizer is not None
                    else None
                )
                if v is None:
                    w.copy_(p)
                else:
                    torch.add(p, v, alpha=-s * lr, out=w)
        return dict(zip(self.names, self._predicted_bufs)), self.version + s

    def _stashed(self, mb: int) -> dict[str, torch.Tensor]:
        v = self.version
        if v not in self.stash:
            self.stash[v] = {
                n: p.detach().clone().requires_grad_() for n, p in zip(self.names, self.params)
            }
        self.stash_users[v] = self.stash_users.get(v, 0) + 1
        self._note_stash()
        return self.stash[v]

    def _unstash(self, v: int) -> None:
        self.stash_users[v] -= 1
        if not self.stash_users[v]:
            del self.stash_users[v]
            del self.stash[v]

    def _note_stash(self) -> None:
        per_copy = sum(p.numel() * p.element_size() for p in self.params)
        older = sum(1 for v in self.stash if v != self.version)
        self.stash_peak = max(self.stash_peak, older * per_copy)

    # ---- passes ------------------------------------------------------------------------
    def _inputs(self, mb: int) -> tuple[torch.Tensor, ...]:
        if self.stage == 0:
            x, _labels = microbatch(self.job, mb, self.M, self.data)
            return x
        return tuple(
            self._take(ACT, mb, j).requires_grad_(c.differentiable)
            for j, c in enumerate(self.mod.inputs)
        )

    def _run(
        self, weights: dict[str, torch.Tensor], x: tuple[torch.Tensor, ...], mb: int, grad: bool
    ) -> tuple[Any, int]:
        seed_pass(pass_seed(self.job, mb, self.stage), self.ctx.setup.device)
        if self.emulated:  # what the device keeps: the trace's activations
            count: Any = emudevice.counting_held()
            hooks: Any = contextlib.nullcontext()
        else:  # what autograd keeps, beside the weights and the inputs
            counter = SavedBytes([*weights.values(), *x])
            count, hooks = contextlib.nullcontext(counter), counter.hooks()
        with torch.set_grad_enabled(grad), count as held, hooks:
            out = self.mod.call(weights, *x)
            if self.mod.is_last:
                _x, labels = microbatch(self.job, mb, self.M, self.data)
                out = (loss_of(out, labels) * self.scale,)
        return out, held.nbytes

    def _forward(self, mb: int, it: int) -> tuple[torch.Tensor, ...]:
        x = self._inputs(mb)
        start = self.rec.now()
        in_bytes = sum(t.numel() * t.element_size() for t in x)
        other_weights = (self.async_ and not self.feat.stash) or self._predict_next
        keep_graph = not self.feat.recompute and (self.emulated or not other_weights)
        version = self.version
        if self._predict_next:
            weights, version = self._prediction or self._predicted(True)
            self._prediction = None
        elif self.feat.stash and self.async_:
            weights = self._stashed(mb)
        else:
            weights = self._current()
        self._predict_next = False
        self._layer_spans(FORWARD, it)
        try:
            out, saved = self._run(weights, x, mb, keep_graph)
        finally:
            self.mod.on_forward = self.mod.on_grad = None
        if self.mod.is_last:
            self.losses.append([mb, float(out[0]) / self.scale])
        held = in_bytes + (saved if keep_graph else 0)
        self.kept[mb] = {
            "x": x,
            "out": out if keep_graph else None,
            "weights": weights,
            "version": version,
            "held": held,
            "marks": self._fwd_marks,
        }
        self._hold(held)
        self.passes.append([mb, sch.FORWARD, version])
        if not self.record_layers:
            emudevice.sync()
            self.rec.span(COMPUTE, FORWARD, f"stage{self.stage} mb{mb}", start, self.rec.now(), it)
        return tuple(o.detach() for o in out)

    def _layer_spans(self, kind: str, it: int) -> None:
        """Before a forward: per-layer forward spans and a gradient mark per layer output
        (when layers are recorded)."""
        self._fwd_marks: list[tuple[tuple[str, int], float]] = []
        if not self.record_layers:
            return
        t0 = self.rec.t0

        def on_forward(layer: tuple[str, int], a: float, b: float) -> None:
            self.rec.span(COMPUTE, kind, layer[0], a - t0, b - t0, it, layer[1])

        self.mod.on_forward = on_forward
        self.mod.on_grad = self._grad_mark(self._fwd_marks)

    def _grad_mark(self, marks: list[Any]) -> Any:
        seen: set[int] = set()

        def on_grad(layer: tuple[str, int]) -> None:
            if layer[1] not in seen:
                seen.add(layer[1])
                marks.append((layer, self.rec.now()))

        return on_grad

    def _recompute(self, mb: int, it: int) -> None:
        k = self.kept[mb]
        start = self.rec.now()
        k["marks"] = []
        if self.record_layers:
            self.mod.on_grad = self._grad_mark(k["marks"])
        out, saved = self._run(k["weights"], k["x"], mb, True)
        self.mod.on_grad = None
        k["out"] = out
        k["held"] += saved
        self._hold(saved)
        self.rec.span(COMPUTE, RECOMPUTE, f"stage{self.stage} mb{mb}", start, self.rec.now(), it)

    def _backward(self, mb: int, it: int) -> list[torch.Tensor | None]:
        k = self.kept.pop(mb)
        out_grads = None
        if not self.mod.is_last:
            out_grads = [
                self._take(ACT_GRAD, mb, j) if c.differentiable else None
                for j, c in enumerate(self.mod.outputs or ())
            ]
        start = self.rec.now()
        weights, version = k["weights"], k["version"]
        out = k["out"]
        self._grad_marks = k.get("marks", [])
        if out is None:  # the backward's weights differ from the forward's
            if self._predict_next:
                weights, version = self._prediction or self._predicted(False)
                self._prediction = None
            else:
                weights, version = self._current(), self.version
            if self.record_layers:
                self.mod.on_grad = self._grad_mark(self._grad_marks)
            out, saved = self._run(weights, k["x"], mb, True)
            self._hold(saved)
            k["held"] += saved
            # its own span (the simulator's re-run before such a backward), so that an
            # in-run profile does not charge it to the backward's first layer
            rerun_end = self.rec.now()
            self.rec.span(
                COMPUTE, RECOMPUTE, f"stage{self.stage} mb{mb} rerun", start, rerun_end, it
            )
            start = rerun_end
        elif self.emulated and self._predict_next:  # the prediction's cost and version
            version = (self._prediction or self._predicted(False))[1]
            self._prediction = None
        elif self.emulated and self.async_ and not self.feat.stash:
            version = self.version
        elif self._load_next:
            version = k["version"]
        self._predict_next = self._load_next = False
        outs, gouts = [], []
        for j, o in enumerate(out):
            if o.requires_grad:
                outs.append(o)
                gouts.append(None if out_grads is None else out_grads[j])
        x_req = [t for t in k["x"] if t.requires_grad]
        w = [weights[n] for n in self.names]
        bstart = self.rec.now()
        with self._weight_grads():
            got = (
                torch.autograd.grad(outs, x_req + w, gouts, allow_unused=True)
                if outs
                else [None] * (len(x_req) + len(w))
            )
        self.mod.on_grad = None
        accumulate(self.grads, got[len(x_req) :], add=not self.emulated)
        if self.record_layers:  # the accumulation is part of the last layer's backward
            marks = sorted(self._grad_marks, key=lambda m: m[1])
            for i, ((name, index), t) in enumerate(marks):
                end = marks[i + 1][1] if i + 1 < len(marks) else self.rec.now()
                self.rec.span(COMPUTE, BACKWARD, name, bstart if i == 0 else t, end, it, index)
            self._grad_marks = []
        in_grads = _per_input(k["x"], got[: len(x_req)])
        self._hold(-k["held"])
        if self.feat.stash and self.async_ and k["out"] is not None:
            self._unstash(k["version"])
        self.passes.append([mb, sch.BACKWARD, version])
        if not self.record_layers:
            emudevice.sync()
            self.rec.span(COMPUTE, BACKWARD, f"stage{self.stage} mb{mb}", start, self.rec.now(), it)
        return in_grads

    def _split_outputs(
        self, mb: int, out: Sequence[torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """The outputs of micro-batch ``mb`` that need a gradient, and their gradients
        (received, or ``None`` for the loss of the last stage)."""
        out_grads = None
        if not self.mod.is_last:
            out_grads = [
                self._take(ACT_GRAD, mb, j) if c.differentiable else None
                for j, c in enumerate(self.mod.outputs or ())
            ]
        outs, gouts = [], []
        for j, o in enumerate(out):
            if o.requires_grad:
                outs.append(o)
                gouts.append(None if out_grads is None else out_grads[j])
        return outs, gouts

    def _backward_input(self, mb: int, it: int) -> list[torch.Tensor | None]:
        """``I``: the gradients of the stage's inputs only; the graph and the output
        gradients stay for the ``W`` pass (see module docs)."""
        k = self.kept[mb]
        outs, gouts = self._split_outputs(mb, k["out"])
        start = self.rec.now()
        x_req = [t for t in k["x"] if t.requires_grad]
        with emudevice.backward_part("input"):
            got = (
                torch.autograd.grad(outs, x_req, gouts, retain_graph=True, allow_unused=True)
                if outs and x_req
                else [None] * len(x_req)
            )
        k["grad_of"] = (outs, gouts)
        in_grads = _per_input(k["x"], got)
        self.passes.append([mb, sch.INPUT_GRAD, k["version"]])
        name = f"stage{self.stage} mb{mb} input grad"
        emudevice.sync()
        self.rec.span(COMPUTE, BACKWARD, name, start, self.rec.now(), it)
        return in_grads

    def _backward_weight(self, mb: int, it: int) -> None:
        """``W``: the weight gradients of micro-batch ``mb`` from the graph its ``I``
        kept, added to the iteration's sums; its activations are released."""
        k = self.kept.pop(mb)
        outs, gouts = k.pop("grad_of")
        start = self.rec.now()
        w = [k["weights"][n] for n in self.names]
        with emudevice.backward_part("weight"), self._weight_grads():
            got = (
                torch.autograd.grad(outs, w, gouts, allow_unused=True)
                if outs and w
                else [None] * len(w)
            )
        accumulate(self.grads, got, add=not self.emulated)
        self._hold(-k["held"])
        self.passes.append([mb, sch.WEIGHT_GRAD, k["version"]])
        name = f"stage{self.stage} mb{mb} weight grad"
        emudevice.sync()
        self.rec.span(COMPUTE, BACKWARD, name, start, self.rec.now(), it)

    def _weight_grads(self) -> Any:
        """Where a backward runs: on an emulated device, with the layers' kept weight
        gradients (:func:`realrun.emudevice.kept_weight_grads`), which the micro-batches
        do not sum (:func:`accumulate`)."""
        return emudevice.kept_weight_grads() if self.emulated else contextlib.nullcontext()

    def _hold(self, nbytes: int) -> None:
        self.act_held += nbytes
        self.act_peak = max(self.act_peak, self.act_held)

    def _update(self, it: int) -> None:
        start = self.rec.now()
        for p, g in zip(self.params, self.grads):
            p.grad = torch.zeros_like(p) if g is None else g
        if self.optimizer is not None:
            self.optimizer.step()
        for p in self.params:
            p.grad = None
        self.grads = [None] * len(self.params)
        self.version += 1
        if self.epoch_iterations and self.version % self.epoch_iterations == 0:
            self.epoch_weights[self.version // self.epoch_iterations] = {
                n: p.detach().clone() for n, p in zip(self.names, self.params)
            }
        self._note_stash()
        self.rec.span(COMPUTE, UPDATE, f"update stage{self.stage}", start, self.rec.now(), it)

    def _allreduce(self, it: int) -> None:
        start = self.rec.now()
        flat = torch.cat(
            [
                (torch.zeros_like(p) if g is None else g).reshape(-1)
                for p, g in zip(self.params, self.grads)
            ]
        )
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.replicas)
        off = 0
        for i, p in enumerate(self.params):
            n = p.numel()
            self.grads[i] = flat[off : off + n].view_as(p).clone()
            off += n
        nbytes = flat.numel() * flat.element_size()
        self.rec.span(
            COMM, "allreduce", f"stage{self.stage} grads", start, self.rec.now(), it, nbytes=nbytes
        )
        ranks = self.schedule.stages[self.stage]
        nxt = ranks[(ranks.index(self.rank) + 1) % len(ranks)]
        pos = ranks.index(self.rank)
        self.rec.count_sent(nxt, it, ring_bytes_sent(pos, self.replicas, nbytes), "allreduce")

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> None:
        """Execute this rank's action list."""
        acts = self.schedule.actions[self.rank]
        last: dict[int, int] = {}
        for i, a in enumerate(acts):
            last[self.schedule.iteration_of(a)] = i
        marks: dict[int, list[int]] = {}
        prev = -1
        for it in range(self.job.total_iterations):
            prev = max(prev, last.get(it, -1))
            marks.setdefault(prev, []).append(it)
        for it in marks.pop(-1, []):
            self.rec.end_iteration(it)
        started: set[int] = set()
        in_grads: dict[tuple[int, int], list[torch.Tensor | None]] = {}
        outputs: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        last_stage = self.n_stages - 1
        for i, a in enumerate(acts):
            it = self.schedule.iteration_of(a)
            if it not in started and it < self.job.total_iterations:
                started.add(it)
                self.ctx.beat(it)
            kind, mb = a.kind, a.mb
            self._use(a.stage)
            if kind == sch.RECV_ACT:
                start = self.rec.now()
                for j in range(len(self.mod.inputs)):
                    self._receive(ACT, mb, j)
                self._wait_span(start, f"wait act mb{mb}", it)
            elif kind == sch.RECV_GRAD:
                start = self.rec.now()
                for j, c in enumerate(self.mod.outputs or ()):
                    if c.differentiable:
                        self._receive(ACT_GRAD, mb, j)
                self._wait_span(start, f"wait grad mb{mb}", it)
            elif kind == sch.FORWARD:
                out = self._forward(mb, it)
                if a.stage < last_stage and self.rank_of[a.stage + 1] == self.rank:
                    for j, t in enumerate(out):  # the next stage is this rank's: no message
                        self.inbox[(ACT, a.stage + 1, mb, j)] = t
                elif not self.mod.is_last:
                    outputs[(a.stage, mb)] = out
            elif kind == sch.SEND_ACT:
                out = outputs.pop((a.stage, mb))
                for j, t in enumerate(out):
                    self.link.send(a.peer, ACT, self._key(a.stage + 1, mb, j), it, t)
            elif kind == sch.RECOMPUTE:
                self._recompute(mb, it)
            elif kind == sch.LOAD:
                self._load_next = True
            elif kind == sch.PREDICT:
                start = self.rec.now()
                self._predict_next = True
                nxt = _next_pass(acts, i)
                if nxt in (sch.FORWARD, sch.BACKWARD):  # now: the span holds the work
                    self._prediction = self._predicted(nxt == sch.FORWARD)
                self.rec.span(
                    COMPUTE, PREDICT, f"predict stage{self.stage}", start, self.rec.now(), it
                )
            elif kind in (sch.BACKWARD, sch.INPUT_GRAD):
                back = self._backward if kind == sch.BACKWARD else self._backward_input
                grads = back(mb, it)
                if a.stage > 0 and self.rank_of[a.stage - 1] == self.rank:
                    for j, g in enumerate(grads):  # the previous stage is this rank's
                        if g is not None:
                            self.inbox[(ACT_GRAD, a.stage - 1, mb, j)] = g
                else:
                    in_grads[(a.stage, mb)] = grads
            elif kind == sch.WEIGHT_GRAD:
                self._backward_weight(mb, it)
            elif kind == sch.SEND_GRAD:
                for j, g in enumerate(in_grads.pop((a.stage, mb))):
                    if g is not None:
                        self.link.send(a.peer, ACT_GRAD, self._key(a.stage - 1, mb, j), it, g)
            elif kind == sch.ALLREDUCE:
                self._allreduce(it)
            elif kind == sch.UPDATE:
                self._update(it)
            for done in marks.get(i, ()):
                emudevice.sync()  # an iteration ends when its device work has
                self.rec.end_iteration(done)
                self.ctx.beat(done, 3)
        self.link.close()
        self._use(self.local[0])
        names = [n for s in self.local for n in (self.mods[s].param_names)]
        self.ctx.extra.update(
            {
                "stage": self.stage,
                "stages": list(self.local),
                "passes": self.passes,
                "stage_params": names,
                "stash_peak_bytes": self.stash_peak,
                "activation_peak_bytes": self.act_peak,
                "microbatches": self.M,
                "losses": self.losses,
                "epoch_weights": self.epoch_weights,
            }
        )

    def _wait_span(self, start: float, what: str, it: int) -> None:
        end = self.rec.now()
        if end - start > 20e-6:
            self.rec.span(COMPUTE, WAIT, what, start, end, it)


def stage_backward(
    out: Sequence[torch.Tensor],
    g_out: Sequence[torch.Tensor | None] | None,
    inputs: Sequence[torch.Tensor],
    weights: list[torch.Tensor],
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """One stage's backward in a single-process replay: the gradients of ``weights`` and
    of ``inputs`` from the stage's outputs ``out`` and their gradients ``g_out`` (``None``
    at the last stage, whose first output is the loss). A weight or input the outputs do
    not depend on gets zeros; an input that needs no gradient gets ``None``."""
    sel = [(o, None if g_out is None else g_out[j]) for j, o in enumerate(out) if o.requires_grad]
    x_req = [t for t in inputs if t.requires_grad]
    got: Sequence[torch.Tensor | None] = (
        torch.autograd.grad(
            [o for o, _ in sel], x_req + weights, [g for _, g in sel], allow_unused=True
        )
        if sel and x_req + weights
        else [None] * (len(x_req) + len(weights))
    )
    w_grads = [torch.zeros_like(t) if g is None else g for t, g in zip(weights, got[len(x_req) :])]
    it_x = iter(got[: len(x_req)])
    g_in: list[torch.Tensor | None] = []
    for t in inputs:
        g = next(it_x) if t.requires_grad else None
        g_in.append(torch.zeros_like(t) if t.requires_grad and g is None else g)
    return w_grads, g_in


def replay_reference(job: Any) -> tuple[dict[str, Any], list[list[Any]]]:
    """Single-process replay of a pipeline's schedule: micro-batches in order, each
    stage's forward and backward on the weight version the schedule prescribes
    (:func:`prescribed_versions` of the rank that runs the micro-batch), each stage's
    updates in its schedule order with the gradients of the backwards before them (a
    replicated stage: the mean of its round's micro-batches, as its all-reduce makes it;
    its replicas hold the same weights). Returns the final ``state_dict`` and, per stage,
    the passes ``[mb, kind, version]``. This is the staleness emulator: it needs no
    processes and gives the distributed run's numerics."""
    from realrun.runtime import build_model

    pipe = job.pipeline
    M = int(pipe["microbatches"])
    feat = features(job.scheme, job.options)
    schedule = make_schedule(
        job.scheme,
        job.options,
        pipe["replicas"],
        M,
        job.total_iterations + int(pipe.get("tail", 0)),
    )
    setup = build_model(job, torch.device("cpu"))
    split = split_model(
        setup.model,
        pipe["stage_layers"],
        job_model(job).example_inputs(job.batch_size // M, "meta"),
    )
    n = len(split.stages)
    scale = 1.0 if not feat.flush else 1.0 / M
    params = [st.stage_parameters() for st in split.stages]
    opts = [make_optimizer(job, ps) if ps else None for ps in params]
    history: list[list[tuple[list[torch.Tensor], list[torch.Tensor | None]]]] = []
    for k in range(n):
        history.append([([p.detach().clone() for p in params[k]], [None] * len(params[k]))])
    if feat.flush and any(len(r) > 1 for r in schedule.stages):
        raise ValueError("the replay covers replicated stages of 1F1B schedules only")
    ver: list[dict[tuple[int, str], int]] = [{} for _ in range(n)]
    for k, ranks in enumerate(schedule.stages):
        for r in ranks:
            ver[k].update({(mb, kind): v for mb, kind, v in prescribed_versions(schedule, r)})
    acts = [schedule.actions[ranks[0]] for ranks in schedule.stages]
    reps = [len(ranks) for ranks in schedule.stages]
    pos = [0] * n
    done_b: list[set[int]] = [set() for _ in range(n)]
    grads: list[dict[int, list[torch.Tensor]]] = [{} for _ in range(n)]
    pending: list[list[torch.Tensor] | None] = [None] * n
    passes: list[list[Any]] = [[] for _ in range(n)]
    cache: dict[int, Any] = {}

    def weights(k: int, v: int, forward: bool, predict: bool) -> dict[str, torch.Tensor]:
        base_v = v - (sch.version_difference(k, n, forward) if predict else 0)
        w, bufs = history[k][base_v]
        s = v - base_v
        out = {}
        for name, t, b in zip(split.stages[k].param_names, w, bufs):
            x = t.clone() if b is None or s == 0 else t - s * job.lr * b
            out[name] = x.requires_grad_()
        return out

    def predicts(k: int, mb: int, kind: str) -> bool:
        seq = schedule.actions[sch.replica_of(schedule.stages, k, mb)]
        for i, a in enumerate(seq):
            if a.kind == kind and a.mb == mb:
                j = i - 1
                while j >= 0 and seq[j].kind not in sch.PASS_KINDS:
                    if seq[j].kind == sch.PREDICT:
                        return True
                    j -= 1
                return False
        return False

    def run_stage(k: int, w: dict[str, torch.Tensor], x: tuple[torch.Tensor, ...], mb: int) -> Any:
        seed_pass(pass_seed(job, mb, k), torch.device("cpu"))
        out = split.stages[k].call(w, *x)
        if split.stages[k].is_last:
            out = (loss_of(out, microbatch(job, mb, M, cache)[1]) * scale,)
        return out

    for mb in range(schedule.microbatches):
        xs, outs, ws = [], [], []
        x = microbatch(job, mb, M, cache)[0]
        for k in range(n):
            v = ver[k][(mb, sch.FORWARD)]
            w = weights(k, v, True, predicts(k, mb, sch.FORWARD))
            x_in = tuple(t.detach().requires_grad_(k > 0 and t.is_floating_point()) for t in x)
            out = run_stage(k, w, x_in, mb)
            xs.append(x_in)
            outs.append(out)
            ws.append(w)
            passes[k].append([mb, sch.FORWARD, v])
            x = tuple(o.detach() for o in out)
        g_out: list[torch.Tensor] | None = None
        for k in reversed(range(n)):
            v = ver[k][(mb, sch.BACKWARD)]
            same = feat.stash or feat.flush
            w, out = ws[k], outs[k]
            if not same:
                w = weights(k, v, False, predicts(k, mb, sch.BACKWARD))
                out = run_stage(k, w, xs[k], mb)
            wl = [w[name] for name in split.stages[k].param_names]
            grads[k][mb], g_out = stage_backward(out, g_out, xs[k], wl)
            passes[k].append([mb, sch.BACKWARD, v])
            done_b[k].add(mb)
        for k in range(n):  # updates whose backwards are all done
            while pos[k] < len(acts[k]):
                a = acts[k][pos[k]]
                if a.kind == sch.BACKWARD:
                    if a.mb not in done_b[k]:
                        break
                    if reps[k] == 1:
                        g = grads[k].pop(a.mb)
                        pending[k] = (
                            g if pending[k] is None else [x + y for x, y in zip(pending[k], g)]
                        )
                elif a.kind == sch.ALLREDUCE:
                    rnd = range(a.mb, a.mb + reps[k])
                    if any(m not in done_b[k] for m in rnd):
                        break
                    parts = [grads[k].pop(m) for m in rnd]
                    pending[k] = [sum(gs) / reps[k] for gs in zip(*parts)]
                elif a.kind == sch.UPDATE:
                    for p, g in zip(params[k], pending[k] or []):
                        p.grad = g.clone()
                    opt = opts[k]
                    if opt is not None:
                        opt.step()
                    pending[k] = None
                    bufs = [
                        opt.state.get(p, {}).get("momentum_buffer") if opt else None
                        for p in params[k]
                    ]
                    history[k].append(
                        (
                            [p.detach().clone() for p in params[k]],
                            [None if b is None else b.clone() for b in bufs],
                        )
                    )
                pos[k] += 1
    state = {k: v.detach().clone() for k, v in setup.model.state_dict().items()}
    return state, passes
