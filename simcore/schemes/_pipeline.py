"""The runner shared by the pipeline schemes (``mp``, ``gpipe``, ``pipedream``,
``spectrain``, and the virtual-stage and zero-bubble schedules ``interleaved``,
``looped-bfs``, ``zb-interleaved``, ``zb-h1``, ``zbv``, ``dualpipev``): partition the
model, make a schedule, execute it.

A pipeline scheme only says how it partitions (straight or with replicated stages) and
which :class:`~simcore.schedule.Schedule` it runs; this module turns the schedule's
per-rank action lists into one SimPy process per rank:

* ``F``/``B``/``R``: the stage's layers, forward, backward or forward again
  (re-materialisation), at micro-batch size (the trace's per-batch times over the number
  of micro-batches), issued layer by layer on the GPU's compute stream;
* ``I``/``W``: the backward split in two (zero bubble): ``I`` the gradient with respect to
  each layer's input, ``W`` the one with respect to its weights. A layer with weights
  spends :data:`WEIGHT_GRAD_SHARE` of its backward in ``W`` (two matrix products of the
  forward's size, one for each gradient), one without weights all of it in ``I``;
* ``SA``/``SG``: the activations (gradients) crossing the stage boundary for one
  micro-batch leave over the topology's links (non-blocking: the rank goes on);
  ``RA``/``RG`` wait until they have arrived;
* ``U``: the optimizer step over the stage's weights; ``P``: SpecTrain's weight
  prediction, one weight-sized vector operation (read weights and velocity, write the
  prediction); ``L``: switch to a stashed weight version (no time);
* ``AR``: the replicas of a stage all-reduce their gradients (ring) once all have joined.

**Iterations.** ``batch_size`` is the mini-batch of the pipeline, split into ``M``
micro-batches; iteration ``i`` is micro-batches ``iM .. (i+1)M - 1``. A rank finishes
iteration ``i`` when it has done all of its actions for those micro-batches (for the
asynchronous 1F1B schemes it is already working on the next iteration by then, so in
steady state an iteration lasts ``M`` times the slowest stage's time per micro-batch).
Schemes without a flush also run ``ceil(2(N-1)/M)`` unmeasured *lead* iterations first
and the micro-batches of ``ceil((N-1)/M)`` iterations after the measured ones (the
pipeline's look-ahead). Right after the fill, the first stages run at their own pace until
the slowest stage's back-pressure reaches them, so without the lead an early iteration
could look faster than the pipeline can sustain; the tail keeps the last measured
iteration out of the drain. The lead and tail iterations' traffic counts in the
communication totals; their spans carry negative (lead) or too-large (tail) iteration
numbers.

**Virtual stages.** A scheme with ``chunks`` > 1 (or a V placement) has the partitioner cut
the model into ``chunks x N`` stages, balanced like any other stages, and places them on
the ranks as its schedule says (:func:`simcore.schedule.placement`); a rank runs, keeps
the weights of and updates every stage it holds. Activations between two stages on the
same rank are not sent.

**Memory per GPU.** Weights, gradients and optimizer state of its stages; the activations
and the stage's input of every micro-batch between its forward and its backward, or its
``W`` pass for a split backward (the weight gradient needs each layer's input) (with
re-materialisation only the stage's input is kept, and one micro-batch's activations
exist during a forward or a recompute); the peak of those alone per GPU is the result's
``activation_peak_bytes``; with weight stashing one weight copy per distinct older
version still needed by a micro-batch in flight (PipeDream: up to ``N - k - 1`` at stage
``k`` besides the current weights); SpecTrain keeps one buffer for the predicted weights.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from simpy import Event

from simcore import schedule as sch
from simcore.collectives import ALLREDUCE_ALGORITHMS
from simcore.config import OPTIMIZERS, ConfigError, SimConfig, option
from simcore.device import Run
from simcore.network import Message
from simcore.partition import METHODS, Partition, PartitionError, partition
from simcore.records import BACKWARD, FORWARD, PREDICT, RECOMPUTE, UPDATE
from simcore.schedule import Schedule, ScheduleError, stages_from_replicas
from simcore.schemes.base import Scheme
from simcore.topology import Topology
from simcore.work import SchemeWork, Workload
from traces.model import Trace

PREDICT_PASSES = 3
"""Weight-sized memory passes of SpecTrain's prediction (read W and v, write W_hat)."""
WEIGHT_GRAD_SHARE = 0.5
"""Share of a layer's backward that computes its weight gradient (``W``) when the backward
is split: the input gradient and the weight gradient are one matrix product each, of the
forward's size (the zero-bubble paper's T_B = T_W)."""


@dataclass(frozen=True)
class PipelineOptions:
    """Options every pipeline scheme has."""

    partition: str = option(
        "antichain",
        "how layers are split into stages: PipeDream's "
        "antichain optimizer or equal layers / params / "
        "compute",
        choices=METHODS,
    )
    stages: str = option(
        "",
        "the stages themselves instead of a partition method: the first layer of every "
        "stage but the first, comma-separated (e.g. body.3,body.6); one GPU per stage",
    )
    activations: bool = option(
        True,
        "let the partitioner count activation transfers "
        "between stages (PipeDream's hierarchical optimizer "
        "does not)",
    )


@dataclass(frozen=True)
class MicrobatchOptions(PipelineOptions):
    """Options of the micro-batched pipeline schemes."""

    microbatches: int = option(
        0,
        "micro-batches per iteration (0: automatic; gpipe: 4 per "
        "stage, pipedream/spectrain: one per GPU rounded up to "
        "whole rounds of every stage's replicas, 1f1b and the virtual-stage and "
        "zero-bubble schedules: 4 per GPU; at most the batch size)",
        minimum=0,
    )


@dataclass(frozen=True)
class PipelineFeatures:
    """What sets one pipeline scheme apart from another, declared once per scheme
    (:attr:`PipelineScheme.features`). A scheme option with the same name as a feature
    (``pipedream``'s ``stash`` and ``straight``, ``gpipe``'s ``recompute``, the
    micro-batched schemes' ``microbatches``) overrides it for a run
    (:meth:`for_options`).

    Attributes:
        straight: one GPU per stage (otherwise the partitioner may replicate stages).
        stash: weight stashing (memory for older weight versions).
        predict: SpecTrain's weight prediction (compute and a buffer).
        recompute: re-materialisation (only the stage input kept per micro-batch).
        flush: the pipeline drains at the end of every iteration (GPipe). Without a
            flush the schedule runs enough iterations more than are measured to cover
            the pipeline's look-ahead (``N - 1`` micro-batches), so that the last
            measured iteration is in steady state and not in the drain; each rank stops
            after finishing the last measured iteration.
        microbatches: micro-batches per iteration; 0: automatic, as below.
        microbatches_per_stage: automatic micro-batches: this many per stage ...
        microbatches_per_gpu: ... or, if set, this many per GPU (rounded up to a
            multiple of every stage's replicas).
        chunks: stages (model chunks) per rank; more than one: virtual stages.
        placement: how the ``chunks x N`` stages sit on the ranks, ``loop`` or ``v``
            (:func:`simcore.schedule.placement`).
    """

    straight: bool = True
    stash: bool = False
    predict: bool = False
    recompute: bool = False
    flush: bool = True
    microbatches: int = 0
    microbatches_per_stage: int = 1
    microbatches_per_gpu: int = 0
    chunks: int = 1
    placement: str = "loop"

    @property
    def backward_at_other_weights(self) -> bool:
        """Whether a micro-batch's backward uses other weights than its forward did:
        SpecTrain's predicted ones, or the current ones of an asynchronous pipeline
        that does not stash (vanilla pipelining)."""
        return self.predict or (not self.flush and not self.stash)

    def for_options(self, options: Any) -> PipelineFeatures:
        """These features with the values of ``options``' fields of the same names."""
        names = {f.name for f in dataclasses.fields(self)}
        given = {
            f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name in names
        }
        return dataclasses.replace(self, **given) if given else self


@dataclass
class StagePlan:
    """What the runner needs about one stage, per micro-batch.

    Attributes:
        ranks: the GPUs running it.
        fwd, bwd: ``(seconds, layer name, layer index)`` of each layer's pass, forward
            order for ``fwd`` and backward order for ``bwd``.
        param_bytes: weights of the stage.
        act_bytes: activations of all its layers (kept for backward).
        in_bytes, out_bytes: activations crossing into / out of the stage.
        kept_in_bytes: the stage's inputs, kept from its forward to its backward (the
            weight gradient of its first layers needs them): ``in_bytes``, or the model's
            input for the first stage.
        bwd_input, bwd_weight: ``bwd`` split into the input-gradient (``I``) and the
            weight-gradient (``W``) pass (see :data:`WEIGHT_GRAD_SHARE`).
    """

    ranks: tuple[int, ...]
    fwd: list[tuple[float, str, int]]
    bwd: list[tuple[float, str, int]]
    param_bytes: int
    act_bytes: float
    in_bytes: float
    out_bytes: float
    kept_in_bytes: float = 0.0
    bwd_input: list[tuple[float, str, int]] = dataclasses.field(default_factory=list)
    bwd_weight: list[tuple[float, str, int]] = dataclasses.field(default_factory=list)

    @property
    def forward_s(self) -> float:
        """Forward seconds per micro-batch."""
        return sum(d for d, _n, _i in self.fwd)

    @property
    def backward_s(self) -> float:
        """Backward seconds per micro-batch."""
        return sum(d for d, _n, _i in self.bwd)


@dataclass(frozen=True)
class PipelinePlan:
    """How a pipeline run is laid out, the same for the simulator and the real runtime
    (:meth:`PipelineScheme.plan`).

    Attributes:
        features: the run's features (the scheme's, with its options applied).
        partition: the stages the partitioner cut.
        microbatches: micro-batches per iteration.
        stages: the ranks of every stage the schedule runs (virtual stages placed on
            their ranks).
        lead: unmeasured iterations run before the measured ones (0 with a flush; see
            module docs).
        tail: iterations' micro-batches run after the measured ones (0 with a flush).
    """

    features: PipelineFeatures
    partition: Partition
    microbatches: int
    stages: tuple[tuple[int, ...], ...]
    lead: int
    tail: int


class PipelineScheme(Scheme):
    """Base of the pipeline schemes (see module docs). A subclass sets ``name``,
    ``summary``, ``Options`` and :attr:`features`, and implements :meth:`make_schedule`:
    that is a whole new pipeline scheme, with its real runtime (the shared one,
    :mod:`realrun.pipeline`, runs any schedule)."""

    Options = PipelineOptions
    features: ClassVar[PipelineFeatures] = PipelineFeatures(microbatches=1)
    """The scheme's features (see :class:`PipelineFeatures`)."""
    pipeline = True
    same_numerics = True  # a flush: one step on the summed micro-batch gradients
    posts_sends = True
    real_runtime = "realrun.pipeline:PipelineRuntime"

    # ---- configuration -----------------------------------------------------------------
    @classmethod
    def check(cls, config: SimConfig, options: Any, topology: Topology) -> None:
        trace = config.trace
        layers = sum(1 for layer in trace.layers if layer.kind != "input")
        n = topology.num_gpus
        features = cls.features.for_options(options)
        v = features.chunks
        if features.straight and n * v > layers:
            if v > 1 and any(f.name == "chunks" for f in dataclasses.fields(options)):
                raise ConfigError(
                    "scheme.chunks",
                    v,
                    f"at most {layers // n} with {n} GPUs: model {trace.meta.model!r} has "
                    f"{layers} layers to split into {n} x {v} stages",
                )
            raise ConfigError(
                "gpus",
                n,
                f"at most {layers // v}: model {trace.meta.model!r} has "
                f"{layers} layers to split into {v} stage(s) per GPU",
            )
        m = features.microbatches
        batch = config.effective_batch_size
        if m > batch:
            raise ConfigError(
                "scheme.microbatches",
                m,
                f"at most the batch size ({batch}): a micro-batch holds at least one sample",
            )

    @classmethod
    def make_partition(
        cls, config: SimConfig, options: Any, topology: Topology, trace: Trace
    ) -> Partition:
        """The stages of ``trace`` for this run: the chosen method over all GPUs (times
        the scheme's stages per GPU), with the inter-stage bandwidth of the topology
        (between the first two GPUs)."""
        feat = cls.features.for_options(options)
        cuts = [c.strip() for c in options.stages.split(",") if c.strip()]
        try:
            return partition(
                trace,
                topology.num_gpus * feat.chunks,
                topology.stage_bandwidth(),
                method=options.partition,
                straight=feat.straight,
                activation_term=options.activations,
                optimizer_copies=OPTIMIZERS[config.optimizer][0],
                cuts=cuts or None,
            )
        except PartitionError as exc:
            if cuts:
                raise ConfigError("scheme.stages", options.stages, str(exc)) from None
            raise ConfigError("scheme.partition", options.partition, str(exc)) from None

    @classmethod
    def microbatches(cls, feat: PipelineFeatures, part: Partition, batch: int, ranks: int) -> int:
        """Micro-batches per iteration of a ``batch``-sample mini-batch on ``ranks`` GPUs:
        the option, or the scheme's automatic choice (capped at the batch size; for
        replicated stages, a multiple of every stage's replica count)."""
        if feat.microbatches > 0:
            return feat.microbatches
        if feat.microbatches_per_gpu:
            # Whole rounds: a multiple of every stage's replica count, within the batch.
            lcm = math.lcm(*part.replicas)
            if batch < lcm:
                raise ConfigError(
                    "batch_size",
                    batch,
                    f"the partition replicates stages {list(part.replicas)} "
                    f"times, which needs at least {lcm} micro-batches of one "
                    "sample; use a larger --batch-size or --set "
                    "scheme.straight=true",
                )
            m = -(-feat.microbatches_per_gpu * part.gpus // lcm) * lcm
            return min(m, batch // lcm * lcm)
        m = feat.microbatches_per_stage * ranks
        return max(1, min(m, batch))

    @classmethod
    def plan(
        cls, config: SimConfig, options: Any, topology: Topology, trace: Trace
    ) -> PipelinePlan:
        """The stages, micro-batches and lead and tail iterations of ``config`` with
        ``options`` on ``topology``, ``trace`` being the layers to split (pure: the
        simulator and the real runtime both lay their runs out with it; ``ConfigError``
        naming the setting that cannot work)."""
        feat = cls.features.for_options(options)
        n = topology.num_gpus
        part = cls.make_partition(config, options, topology, trace)
        mbs = cls.microbatches(feat, part, config.effective_batch_size, n)
        stages = cls.stage_ranks(options, part.replicas)
        for k, ranks in enumerate(stages):
            if mbs % len(ranks):
                raise ConfigError(
                    "scheme.microbatches",
                    mbs,
                    f"stage {k} has {len(ranks)} replicas: the micro-batches "
                    "per iteration must be a multiple of that",
                )
        lead = 0 if feat.flush else -(-2 * (n - 1) // mbs)
        tail = 0 if feat.flush else -(-(n - 1) // mbs)
        return PipelinePlan(feat, part, mbs, stages, lead, tail)

    @classmethod
    def schedule_for(cls, plan: PipelinePlan, iterations: int, options: Any) -> Schedule:
        """The schedule of ``plan`` for ``iterations`` iterations (:meth:`make_schedule`;
        ``ConfigError`` naming the micro-batches when the schedule cannot take them)."""
        try:
            return cls.make_schedule(plan.stages, plan.microbatches, iterations, options)
        except ScheduleError as exc:
            raise ConfigError("scheme.microbatches", plan.microbatches, str(exc)) from None

    @classmethod
    def make_schedule(
        cls, stages: tuple[tuple[int, ...], ...], microbatches: int, iterations: int, options: Any
    ) -> Schedule:
        """The schedule of ``iterations`` iterations with these ``options`` (overridden by
        each scheme; ``sim schedule`` calls it too)."""
        raise ScheduleError(f"scheme {cls.name!r} defines no schedule")

    @classmethod
    def place(
        cls, stages: tuple[tuple[int, ...], ...], options: Any
    ) -> tuple[tuple[int, ...], ...]:
        """The ranks of every stage the schedule runs, from the ranks of one stage each
        (``stages``): unchanged, or with the scheme's ``chunks`` stages per rank placed
        ``loop`` or ``v`` (``sim schedule`` calls it too)."""
        feat = cls.features.for_options(options)
        if feat.chunks == 1 and feat.placement == "loop":
            return stages
        if any(len(ranks) > 1 for ranks in stages):
            raise ScheduleError(f"{cls.name} has no replicated stages")
        return sch.placement(len(stages), feat.chunks, feat.placement)

    @classmethod
    def stage_ranks(cls, options: Any, replicas: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """The ranks of every stage the schedule runs, from the replica counts of the
        partition's stages: consecutive ranks, or the scheme's placement of its virtual
        stages (``replicas`` then has one entry per stage, ``chunks`` per rank)."""
        feat = cls.features.for_options(options)
        if feat.chunks > 1 or feat.placement != "loop":
            return cls.place(sch.straight_stages(len(replicas) // feat.chunks), options)
        return stages_from_replicas(replicas)

    def replicas(self) -> int:
        """One model replica: the whole pipeline processes ``batch_size`` per iteration."""
        return 1

    @classmethod
    def estimate_work(cls, work: Workload) -> SchemeWork:
        """Every stage (chunks per GPU x GPUs) runs every micro-batch forward and backward
        and sends its activations and gradients on."""
        p, its = work.gpus, work.iterations
        feat = cls.features.for_options(work.options)
        v = feat.chunks
        # the micro-batches :meth:`microbatches` picks, without the partition's rounding
        m = feat.microbatches or (feat.microbatches_per_gpu or feat.microbatches_per_stage) * p
        return SchemeWork(
            messages=its * m * 2 * p * v,
            moved_bytes=its * m * 2.0 * work.activation_bytes / work.layers * p,
            compute_ops=its * m * 2 * work.layers + its * m * p * v,
        )

    # ---- set-up ------------------------------------------------------------------------
    def start(self) -> None:
        ctx = self.ctx
        opts = self.options
        plan = self.plan(ctx.config, opts, ctx.topology, ctx.trace)
        self.feat = feat = plan.features
        """The features of this run (the scheme's, with its options applied)."""
        self.reruns_forward = feat.backward_at_other_weights and ctx.topology.gpu_spec.kind == "cpu"
        """Whether each backward re-runs its forward first: a backward at other weights
        than its forward's (:attr:`PipelineFeatures.backward_at_other_weights`) on ranks
        that compute for real on CPU hosts. Autograd differentiates the activations a
        forward computed, so the real runtime runs the stage's forward again from the
        kept input at the backward's weights (docs/realrun.md, "Numerics"), and the
        forward keeps no activations. Devices (GPUs, emulated GPU hosts) take the
        scheme's cost without it."""
        self.part = plan.partition
        self.microbatches_per_iteration = plan.microbatches
        self.lead = plan.lead
        runs = plan.lead + ctx.iterations + plan.tail
        self.schedule = self.schedule_for(plan, runs, opts)
        ctx.simulated_iterations = runs
        stages = plan.stages
        self.plans = [
            self._plan(k, st, ranks) for k, (st, ranks) in enumerate(zip(self.part.stages, stages))
        ]
        self.local = self.schedule.local_stages()
        self.mail: dict[tuple[int, str, int], Event] = {}
        self.joined: dict[tuple[int, int], list[Any]] = {}
        self.version = [0] * len(self.plans)
        self.used: list[dict[int, int]] = [{} for _ in ctx.gpus]  # mb -> version
        self.stashed = [0] * ctx.num_ranks
        self.stash_peak = [0] * ctx.num_ranks
        self.act_peak = [0.0] * ctx.num_ranks
        opt_copies = ctx.optimizer_state_bytes(1)
        for r, gpu in enumerate(ctx.gpus):
            mem = gpu.memory
            for s in self.local[r]:
                plan = self.plans[s]
                mem.alloc("weights", plan.param_bytes)
                mem.alloc("gradients", plan.param_bytes)
                mem.alloc("optimizer", opt_copies * plan.param_bytes)
                if feat.predict:
                    mem.alloc("buffers", plan.param_bytes)
            ctx.env.process(self._rank(r))

    def _plan(self, k: int, stage: Any, ranks: tuple[int, ...]) -> StagePlan:
        trace, m = self.ctx.trace, self.microbatches_per_iteration
        run = [i for i in stage.layers if trace.layers[i].kind != "input"]
        prev = self.part.stages[k - 1].out_bytes if k else 0
        lay = trace.layers
        share = [WEIGHT_GRAD_SHARE if lay[i].param_bytes > 0 else 0.0 for i in run]
        return StagePlan(
            ranks=ranks,
            # a micro-batch pass: each layer's fixed part whole, the rest in proportion
            fwd=[(lay[i].forward_share_s(1 / m), lay[i].name, i) for i in run],
            bwd=[(lay[i].backward_share_s(1 / m), lay[i].name, i) for i in reversed(run)],
            param_bytes=stage.param_bytes,
            act_bytes=stage.activation_bytes / m,
            in_bytes=prev / m,
            out_bytes=stage.out_bytes / m,
            kept_in_bytes=(
                prev if k else sum(lay[i].activation_bytes for i in stage.layers if i not in run)
            )
            / m,
            bwd_input=[
                (lay[i].backward_share_s(1 / m) * (1 - w), lay[i].name, i)
                for i, w in reversed(list(zip(run, share)))
            ],
            bwd_weight=[
                (lay[i].backward_share_s(1 / m) * w, lay[i].name, i)
                for i, w in reversed(list(zip(run, share)))
                if w > 0
            ],
        )

    # ---- execution ---------------------------------------------------------------------
    def _rank(self, r: int) -> Any:
        ctx = self.ctx
        gpu = ctx.gpus[r]
        mem = gpu.memory
        sched = self.schedule
        acts = sched.actions[r]
        marks = self._marks(r)
        for it in marks.pop(-1, []):
            ctx.mark_iteration(r, it)
            if it == ctx.iterations - 1:
                return
        gpu_spec = ctx.topology.gpu_spec
        update_s = {s: ctx.update_s(self.plans[s].param_bytes) for s in self.local[r]}
        predict_s = {
            s: gpu_spec.predict_overhead_s
            + PREDICT_PASSES * self.plans[s].param_bytes / gpu_spec.memory_bandwidth_bytes_per_s
            for s in self.local[r]
        }
        dev = ctx.topology.gpus
        lead = self.lead
        recompute = self.feat.recompute
        rerun = self.reruns_forward
        act_peak = self.act_peak
        for i, a in enumerate(acts):
            kind, mb, s = a.kind, a.mb, a.stage
            plan = self.plans[s]
            held = plan.act_bytes + plan.kept_in_bytes
            it = mb // sched.per_iteration - lead
            if kind == sch.FORWARD:
                self._on_forward(r, s, mb)
                mem.alloc("activations", held)
                act_peak[r] = max(act_peak[r], mem.held["activations"])
                yield self._pass(gpu, plan.fwd, FORWARD, it, mb)
                if recompute or rerun:
                    mem.free("activations", plan.act_bytes)
            elif kind == sch.BACKWARD:
                if rerun:  # the forward again, at the backward's weights
                    mem.alloc("activations", plan.act_bytes)
                    act_peak[r] = max(act_peak[r], mem.held["activations"])
                    yield self._pass(gpu, plan.fwd, RECOMPUTE, it, mb)
                yield self._pass(gpu, plan.bwd, BACKWARD, it, mb)
                mem.free("activations", held)
                self._on_backward(r, s, mb)
            elif kind == sch.INPUT_GRAD:
                yield self._pass(gpu, plan.bwd_input, BACKWARD, it, mb)
            elif kind == sch.WEIGHT_GRAD:
                yield self._pass(gpu, plan.bwd_weight, BACKWARD, it, mb)
                mem.free("activations", held)
                self._on_backward(r, s, mb)
            elif kind == sch.RECOMPUTE:
                mem.alloc("activations", plan.act_bytes)
                act_peak[r] = max(act_peak[r], mem.held["activations"])
                yield self._pass(gpu, plan.fwd, RECOMPUTE, it, mb)
            elif kind == sch.UPDATE:
                yield gpu.compute(update_s[s], UPDATE, f"update stage {s}", it, -1, mb)
                self._on_update(s)
            elif kind == sch.PREDICT:
                yield gpu.compute(predict_s[s], PREDICT, f"predict stage {s}", it, -1, mb)
            elif kind in sch.SEND_KINDS:
                act = kind == sch.SEND_ACT
                # posted ahead (realrun.p2p): no sender thread; the stage's own
                # thread writes it (its receive is posted)
                ctx.transport.isend_on_thread(
                    dev[r],
                    dev[a.peer],
                    round(plan.out_bytes if act else plan.in_bytes),
                    self._arrived,
                    tag=f"{'act' if act else 'grad'} mb{mb}",
                    rank_src=r,
                    rank_dst=a.peer,
                    iteration=it,
                    payload=(
                        a.peer,
                        sch.RECV_ACT if act else sch.RECV_GRAD,
                        mb,
                        s + 1 if act else s - 1,
                    ),
                )
            elif kind in sch.RECV_KINDS:
                yield self._box((r, kind, mb, s))
            elif kind == sch.ALLREDUCE:
                yield self._allreduce(s, mb, it)
            # LOAD takes no time: the stashed version was kept since the forward
            for done in marks.get(i, ()):
                ctx.mark_iteration(r, done)
                if done == ctx.iterations - 1:
                    return

    def _pass(
        self, gpu: Any, layers: list[tuple[float, str, int]], kind: str, it: int, mb: int
    ) -> Any:
        """Queue a pass, layer by layer, as one run (one event; one span per layer when
        spans are recorded, and with compute jitter one factor per layer either way);
        returns the event of its end (what the rank yields)."""
        if not layers:
            return gpu.compute(0.0, kind, "", it, -1, mb)
        return gpu.compute_seq(Run(it, [(dur, kind, name, it, i, mb) for dur, name, i in layers]))

    def _marks(self, r: int) -> dict[int, list[int]]:
        """Action index after which rank ``r`` has finished each measured iteration
        (``-1``: before its first action, for iterations it has no part in)."""
        sched = self.schedule
        last: dict[int, int] = {}
        for i, a in enumerate(sched.actions[r]):
            last[sched.iteration_of(a) - self.lead] = i
        out: dict[int, list[int]] = {}
        prev = -1
        for it in range(self.ctx.iterations):
            prev = max(prev, last.get(it, -1))
            out.setdefault(prev, []).append(it)
        return out

    def _box(self, key: tuple[int, str, int, int]) -> Event:
        ev = self.mail.get(key)
        if ev is None:
            ev = self.mail[key] = self.ctx.env.event()
        return ev

    def _arrived(self, msg: Message) -> None:
        self._box(msg.payload).succeed()

    def _allreduce(self, s: int, round_id: int, it: int) -> Event:
        """The event of stage ``s``'s all-reduce for ``round_id``; it starts once all
        replicas have joined."""
        key = (s, round_id)
        entry = self.joined.get(key)
        if entry is None:
            entry = self.joined[key] = [0, self.ctx.env.event()]
        entry[0] += 1
        plan = self.plans[s]
        if entry[0] == len(plan.ranks):
            done = entry[1]
            self.ctx.coll.allreduce(
                plan.ranks,
                plan.param_bytes,
                ALLREDUCE_ALGORITHMS[0],
                lambda _t: done.succeed(),
                tag=f"stage{s} grads",
                iteration=it,
            )
        return entry[1]

    # ---- weight versions (stashing) ----------------------------------------------------
    def _on_forward(self, r: int, s: int, mb: int) -> None:
        if self.feat.stash:
            self.used[r][mb] = self.version[s]
            self._restash(r, s)

    def _on_backward(self, r: int, s: int, mb: int) -> None:
        if self.feat.stash:
            self.used[r].pop(mb, None)
            self._restash(r, s)

    def _on_update(self, s: int) -> None:
        self.version[s] += 1
        if self.feat.stash:
            for r in self.plans[s].ranks:
                self._restash(r, s)

    def _restash(self, r: int, s: int) -> None:
        """Hold one weight copy per older version an in-flight micro-batch still needs."""
        need = len(set(self.used[r].values()) - {self.version[s]})
        delta = need - self.stashed[r]
        if delta:
            mem = self.ctx.gpus[r].memory
            nbytes = self.plans[s].param_bytes
            if delta > 0:
                mem.alloc("stash", delta * nbytes)
            else:
                mem.free("stash", -delta * nbytes)
            self.stashed[r] = need
            self.stash_peak[r] = max(self.stash_peak[r], need * nbytes)

    # ---- results -----------------------------------------------------------------------
    def extra_metrics(self) -> dict[str, Any]:
        part = self.part
        names = [layer.name for layer in self.ctx.trace.layers]
        return {
            "partition": part.method,
            "stages": len(part.stages),
            "microbatches": self.microbatches_per_iteration,
            "stage_replicas": list(part.replicas),
            "stage_layers": [
                [names[st.layers[0]], names[st.layers[-1]], len(st.layers)] for st in part.stages
            ],
            "stage_time_s": [_g9(p.forward_s + p.backward_s) for p in self.plans],
            "bottleneck_stage_s": _g9(
                max((p.forward_s + p.backward_s) / len(p.ranks) for p in self.plans)
            ),
            "stash_peak_bytes": list(self.stash_peak),
            "activation_peak_bytes": [round(b) for b in self.act_peak],
            "chunks": self.feat.chunks,
            "placement": self.feat.placement,
            "rank_stages": [list(st) for st in self.local],
            "rank_time_s": [
                _g9(sum(self.plans[s].forward_s + self.plans[s].backward_s for s in st))
                for st in self.local
            ],
        }


def _g9(x: float) -> float:
    """``x`` to nine significant digits (for readable tables)."""
    return float(f"{x:.9g}")
