"""The staleness emulator: a whole training run of any scheme, many epochs, in one
process, with the numerics of the distributed run.

What a scheme does to the *numbers* is much smaller than what it does to the time:

* the schemes whose class says ``same_numerics``: ``dp``, ``ps``, ``p3`` (synchronous:
  every step applies the mean gradient of all the workers' samples, as
  ``tests/test_real.py`` checks against the real runtimes), ``mp``, ``gpipe`` and the
  other pipelines with a flush (the micro-batches' gradients summed with the loss over
  ``M``, one step per mini-batch): plain SGD on each update batch;
* ``gossip``: one model per worker, all from the same initial weights; each iteration
  every worker takes the gradient of its batch (with ``shuffle``, the batch its partner
  sent) and steps, exchanging with its partner
  (:func:`simcore.schemes.gossip.partners`) as :mod:`realrun.schemes.gossip` does:
  ``exchange=weights`` (default) averages in, at the start of each iteration, the weights
  and optimizer state the last partner sent at the start of the last one, and sends its
  own; ``gradients`` averages the gradient with the partner's; ``gradients+weights`` also
  the weights the gradients were taken on;
* ``pipedream`` (stashing on or off) and ``spectrain`` (``update_per_microbatch``):
  every stage's forward and backward of every micro-batch on the weight version the
  schedule prescribes (:func:`realrun.pipeline.prescribed_versions`, predicted as
  ``W - s * lr * v`` for SpecTrain), each stage's update after the backward that precedes
  it in its action list: the single-process replay of
  :func:`realrun.pipeline.replay_reference`, over epochs, keeping only the weight versions
  still to be used.

After every epoch (``U`` update batches, :mod:`realrun.data`) the weights each stage has
after its ``e * U``-th update are put together and evaluated on the validation split
(loss and accuracy; for ``gossip``, worker 0's model, with the workers' disagreement:
:func:`disagreement`). The training loss of an epoch is
the mean of the losses the run computed on its update batches (for a pipeline, the last
stage's loss of each micro-batch, on whatever weights it ran with).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from realrun import data, zoo
from realrun.job import Job
from realrun.runtime import build_model, loss_of, make_optimizer
from simcore import schedule as sch
from simcore.schemes import get_scheme


@dataclass
class Emulation:
    """What :func:`emulate` returns.

    Attributes:
        epochs: one dictionary per epoch: ``epoch`` (1-based), ``updates`` and ``samples``
            (cumulative), ``train_loss``, ``val_loss``, ``val_accuracy`` (``gossip``:
            ``disagreement`` too).
        epoch_weights: ``{epoch: {parameter name: tensor}}`` (with ``keep_weights``).
        passes: per pipeline stage, ``[mb, kind, version]`` of every pass it ran.
        gaps: per pipeline stage, for every micro-batch, the updates between the version
            its forward used and the update its gradient went into.
    """

    epochs: list[dict[str, float]] = field(default_factory=list)
    epoch_weights: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    passes: list[list[list[Any]]] = field(default_factory=list)
    gaps: list[list[int]] = field(default_factory=list)


def epochs_of(job: Job) -> int:
    """Whole epochs the job's iterations cover."""
    return job.total_iterations * data.updates_per_iteration(job) // data.updates_per_epoch(job)


# ---- evaluation -------------------------------------------------------------------------


def evaluator(job: Job) -> Callable[[Mapping[str, torch.Tensor]], tuple[float, float]]:
    """A function of a model's weights (parameter name -> tensor) that returns its
    ``(loss, accuracy)`` on the job's validation split."""
    return _Evaluator(job)


class _Evaluator:
    def __init__(self, job: Job) -> None:
        torch.manual_seed(job.seed)
        self.model = zoo.build(job.model)
        self.x, self.y = data.validation(job)

    @torch.no_grad()
    def __call__(self, weights: Mapping[str, torch.Tensor]) -> tuple[float, float]:
        missing = sorted({n for n, _p in self.model.named_parameters()} - set(weights))
        if missing:
            raise ValueError(f"no weights for {', '.join(missing)}")
        self.model.load_state_dict(dict(weights), strict=False)
        out = self.model(*self.x)
        loss = float(loss_of(out, self.y))
        acc = float((out.argmax(-1) == self.y).float().mean())
        return loss, acc


def _record(
    em: Emulation,
    ev: _Evaluator,
    job: Job,
    epoch: int,
    weights: Mapping[str, torch.Tensor],
    losses: list[float],
    keep: bool,
) -> None:
    u = data.updates_per_epoch(job)
    vl, va = ev(weights)
    em.epochs.append(
        {
            "epoch": epoch,
            "updates": epoch * u,
            "samples": epoch * u * data.update_batch(job),
            "train_loss": sum(losses) / len(losses) if losses else float("nan"),
            "val_loss": vl,
            "val_accuracy": va,
        }
    )
    if keep:
        em.epoch_weights[epoch] = {k: v.detach().clone() for k, v in weights.items()}


# ---- the schemes ------------------------------------------------------------------------


def emulate(
    job: Job,
    epochs: int | None = None,
    keep_weights: bool = False,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    spectrain_distance: Callable[[int, int, bool], int] | None = None,
) -> Emulation:
    """Train ``job`` (a job with ``data``; :func:`analysis.convergence.training_job`
    makes one) for ``epochs`` epochs (default: all its iterations cover) in this process
    (see module docs).
    ``on_epoch`` is called with each epoch's row; ``spectrain_distance(stage, stages,
    forward)`` replaces :func:`simcore.schedule.version_difference` in SpecTrain's
    prediction (tests: distance 0 must give vanilla pipelining)."""
    if not job.data:
        raise ValueError("the emulator trains on a data set; give the job one (data='digits')")
    epochs = epochs_of(job) if epochs is None else epochs
    cls = get_scheme(job.scheme)
    if cls.same_numerics:
        return _sync(job, epochs, keep_weights, on_epoch)
    if job.scheme == "gossip":  # the emulator's model of gossip's exchanges
        return _gossip(job, epochs, keep_weights, on_epoch)
    if cls.update_per_microbatch:  # replayed stage by stage
        return _pipeline(job, epochs, keep_weights, on_epoch, spectrain_distance)
    raise ValueError(f"scheme: {job.scheme!r} is not allowed; the emulator has no model of it")


def _update_batches(job: Job) -> tuple[int, Callable[[int], tuple[Any, torch.Tensor]]]:
    split = data.load(job.data, job.seed)
    b = data.update_batch(job)

    def get(u: int) -> tuple[Any, torch.Tensor]:
        idx = data.update_indices(job.data, job.seed, b, u)
        return data.shaped(job.model, split.train_x[idx]), split.train_y[idx]

    return data.updates_per_epoch(job), get


def _sync(job: Job, epochs: int, keep: bool, on_epoch: Any) -> Emulation:
    em = Emulation()
    model = build_model(job, torch.device("cpu")).model
    ev = _Evaluator(job)
    opt = make_optimizer(job, list(model.parameters()))
    u_per, get = _update_batches(job)
    for e in range(epochs):
        losses = []
        for u in range(e * u_per, (e + 1) * u_per):
            x, y = get(u)
            opt.zero_grad(set_to_none=True)
            loss = loss_of(model(*x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        _record(em, ev, job, e + 1, dict(model.named_parameters()), losses, keep)
        if on_epoch:
            on_epoch(em.epochs[-1])
    return em


def _gossip(job: Job, epochs: int, keep: bool, on_epoch: Any) -> Emulation:
    from realrun.schemes.gossip import mix_in, pack
    from simcore.schemes.gossip import GossipOptions, partners

    opts = job.options
    defaults = GossipOptions()
    schedule = str(opts.get("schedule", defaults.schedule))
    rotation = str(opts.get("rotation", defaults.rotation))
    exchange = str(opts.get("exchange", defaults.exchange))
    p = job.workers
    shuffle = bool(opts.get("shuffle", defaults.shuffle)) and p > 1
    by_weights = exchange == "weights" and p > 1
    em = Emulation()
    models = [build_model(job, torch.device("cpu")).model for _ in range(p)]
    params = [list(m.parameters()) for m in models]
    optims = [make_optimizer(job, ps) for ps in params]
    ev = _Evaluator(job)
    u_per = data.updates_per_epoch(job)
    total = epochs * u_per
    sent: list[list[torch.Tensor]] = []

    def snapshot(r: int) -> list[torch.Tensor]:
        # what worker r sends: each parameter's weights and optimizer state
        return [pack(optims[r], [q]) for q in params[r]]

    def mix(it: int) -> None:
        # the weights and state the partner of ``it`` sent at its start, averaged in
        recv = partners(p, it, schedule, rotation)[1]
        for r in range(p):
            for q, msg in zip(params[r], sent[recv[r]]):
                mix_in(optims[r], [q], msg)

    losses: list[float] = []

    def record(epoch: int) -> None:
        nonlocal losses
        _record(em, ev, job, epoch, dict(models[0].named_parameters()), losses, keep)
        em.epochs[-1]["disagreement"] = disagreement([dict(m.named_parameters()) for m in models])
        losses = []
        if on_epoch:
            on_epoch(em.epochs[-1])

    for it in range(total):
        if by_weights:
            if it > 0:
                mix(it - 1)
            sent = [snapshot(r) for r in range(p)]
        if it and it % u_per == 0:
            record(it // u_per)
        if it == 0 or not shuffle:
            src = list(range(p))
        else:
            src = partners(p, it - 1, schedule, rotation)[1]
        grads = []
        for r, m in enumerate(models):
            x, y = data.batch(job, src[r], it)
            m.zero_grad(set_to_none=True)
            loss = loss_of(m(*x), y)
            loss.backward()
            losses.append(float(loss.detach()))
            grads.append([q.grad for q in params[r]])
        if not by_weights and p > 1:
            recv = partners(p, it, schedule, rotation)[1]
            weights = [[q.detach().clone() for q in ps] for ps in params]
            for r in range(p):
                for k, q in enumerate(params[r]):
                    g, h = grads[r][k], grads[recv[r]][k]
                    q.grad = (g + h) / 2
                    if exchange == "gradients+weights":
                        with torch.no_grad():
                            q.copy_((weights[r][k] + weights[recv[r]][k]) / 2)
        for o in optims:
            o.step()
    if by_weights:
        mix(total - 1)
    record(epochs)
    return em


def disagreement(weights: list[Mapping[str, torch.Tensor]]) -> float:
    """The workers' disagreement: the mean over workers of the Euclidean distance of each
    one's weights (``{parameter name: tensor}``, all parameters as one vector) from the
    workers' average."""
    names = sorted(weights[0])
    flat = torch.stack(
        [torch.cat([w[n].detach().reshape(-1) for n in names]) for w in weights]
    ).double()
    return float((flat - flat.mean(0)).norm(dim=1).mean())


def _pipeline(
    job: Job,
    epochs: int,
    keep: bool,
    on_epoch: Any,
    distance: Callable[[int, int, bool], int] | None,
) -> Emulation:
    from realrun.pipeline import (
        features,
        make_schedule,
        pass_seed,
        prescribed_versions,
        seed_pass,
        stage_backward,
    )
    from realrun.stages import split_model

    distance = distance or sch.version_difference
    pipe = job.pipeline
    M = int(pipe["microbatches"])
    feat = features(job.scheme, job.options)
    schedule = make_schedule(
        job.scheme, job.options, pipe["replicas"], M, job.total_iterations + int(pipe["tail"])
    )
    setup = build_model(job, torch.device("cpu"))
    split = split_model(
        setup.model,
        pipe["stage_layers"],
        zoo.example_inputs(job.model, job.batch_size // M, "meta"),
    )
    n = len(split.stages)
    if any(len(r) > 1 for r in schedule.stages):
        raise ValueError(
            "the emulator replays straight pipelines (one rank per stage); set scheme.straight=true"
        )
    u_per = data.updates_per_epoch(job)
    total = epochs * u_per
    if total > schedule.microbatches:
        raise ValueError(f"the job covers {schedule.microbatches} updates, {total} asked")
    params = [st.stage_parameters() for st in split.stages]
    names = [st.param_names for st in split.stages]
    opts = [make_optimizer(job, ps) if ps else None for ps in params]
    # the version each pass uses, whether it is predicted, and the update it feeds
    ver: list[dict[tuple[int, str], int]] = []
    pred: list[set[tuple[int, str]]] = []
    feeds: list[dict[int, int]] = []
    for k in range(n):
        r = schedule.stages[k][0]
        ver.append({(mb, kind): v for mb, kind, v in prescribed_versions(schedule, r)})
        ps: set[tuple[int, str]] = set()
        fd: dict[int, int] = {}
        flag = False
        updates = 0
        waiting: list[int] = []
        for a in schedule.actions[r]:
            if a.kind == sch.PREDICT:
                flag = True
            elif a.kind in (sch.FORWARD, sch.BACKWARD):
                if flag:
                    ps.add((a.mb, a.kind))
                flag = False
                if a.kind == sch.BACKWARD:
                    waiting.append(a.mb)
            elif a.kind == sch.UPDATE:
                for mb in waiting:
                    fd[mb] = updates
                waiting = []
                updates += 1
        pred.append(ps)
        feeds.append(fd)
    # the oldest version each stage still needs after micro-batch mb
    need: list[list[int]] = []
    for k in range(n):
        base = []
        for mb in range(total):
            vs = []
            for kind, fwd in ((sch.FORWARD, True), (sch.BACKWARD, False)):
                v = ver[k][(mb, kind)]
                if (mb, kind) in pred[k]:
                    v -= sch.version_difference(k, n, fwd)
                vs.append(v)
            base.append(min(vs))
        suffix = [0] * (total + 1)
        suffix[total] = 1 << 62
        for mb in reversed(range(total)):
            suffix[mb] = min(base[mb], suffix[mb + 1])
        need.append(suffix)
    history: list[dict[int, tuple[list[torch.Tensor], list[torch.Tensor | None]]]] = [
        {0: ([p.detach().clone() for p in params[k]], [None] * len(params[k]))} for k in range(n)
    ]
    pos = [0] * n
    acts = [schedule.actions[ranks[0]] for ranks in schedule.stages]
    done_b: list[set[int]] = [set() for _ in range(n)]
    grads: list[dict[int, list[torch.Tensor]]] = [{} for _ in range(n)]
    pending: list[list[torch.Tensor] | None] = [None] * n
    version = [0] * n
    em = Emulation(passes=[[] for _ in range(n)], gaps=[[] for _ in range(n)])
    ev = _Evaluator(job)
    cache: dict[int, Any] = {}
    snap: dict[int, dict[str, torch.Tensor]] = {}
    snap_count: dict[int, int] = {}
    losses: dict[int, list[float]] = {}
    recorded = 0

    def weights(k: int, v: int, fwd: bool, predict: bool) -> dict[str, torch.Tensor]:
        # v counts a prediction as the version it predicts (the schedule's distance)
        w, bufs = history[k][v - (sch.version_difference(k, n, fwd) if predict else 0)]
        s = distance(k, n, fwd) if predict else 0
        out = {}
        for name, t, b in zip(names[k], w, bufs):
            x = t.clone() if b is None or s == 0 else t - s * job.lr * b
            out[name] = x.requires_grad_()
        return out

    def microbatch(mb: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        # realrun.pipeline.microbatch's slicing, on the data set's batches
        it, j = divmod(mb, M)
        if it not in cache:
            cache.clear()
            cache[it] = data.batch(job, 0, it)
        inputs, labels = cache[it]
        size = job.batch_size // M
        sl = slice(j * size, (j + 1) * size)
        return tuple(t[sl] for t in inputs), labels[sl]

    def run_stage(k: int, w: dict[str, torch.Tensor], x: tuple[torch.Tensor, ...], mb: int) -> Any:
        # the distributed run's dropout masks (the CPU generator is all a CPU run draws from)
        seed_pass(pass_seed(job, mb, k), torch.device("cpu"))
        out = split.stages[k].call(w, *x)
        if split.stages[k].is_last:
            loss = loss_of(out, microbatch(mb)[1])
            out = (loss,)
        return out

    for mb in range(total):
        xs, outs, ws = [], [], []
        x = microbatch(mb)[0]
        for k in range(n):
            v = ver[k][(mb, sch.FORWARD)]
            w = weights(k, v, True, (mb, sch.FORWARD) in pred[k])
            x_in = tuple(t.detach().requires_grad_(k > 0 and t.is_floating_point()) for t in x)
            out = run_stage(k, w, x_in, mb)
            xs.append(x_in)
            outs.append(out)
            ws.append(w)
            em.passes[k].append([mb, sch.FORWARD, v])
            x = tuple(o.detach() for o in out)
        losses.setdefault(mb // u_per, []).append(float(outs[-1][0].detach()))
        g_out: list[torch.Tensor] | None = None
        for k in reversed(range(n)):
            v = ver[k][(mb, sch.BACKWARD)]
            w, out = ws[k], outs[k]
            if not feat.stash:
                w = weights(k, v, False, (mb, sch.BACKWARD) in pred[k])
                out = run_stage(k, w, xs[k], mb)
            wl = [w[name] for name in names[k]]
            grads[k][mb], g_out = stage_backward(out, g_out, xs[k], wl)
            em.passes[k].append([mb, sch.BACKWARD, v])
            em.gaps[k].append(feeds[k][mb] - ver[k][(mb, sch.FORWARD)])
            done_b[k].add(mb)
        for k in range(n):  # the updates whose backwards are all done
            while pos[k] < len(acts[k]) and version[k] < total:
                a = acts[k][pos[k]]
                if a.kind == sch.BACKWARD:
                    if a.mb not in done_b[k]:
                        break
                    g = grads[k].pop(a.mb)
                    pending[k] = g if pending[k] is None else [p + q for p, q in zip(pending[k], g)]
                elif a.kind == sch.UPDATE:
                    for p, g in zip(params[k], pending[k] or []):
                        p.grad = g.clone()
                    opt = opts[k]
                    if opt is not None:
                        opt.step()
                    pending[k] = None
                    version[k] += 1
                    bufs = [
                        opt.state.get(p, {}).get("momentum_buffer") if opt else None
                        for p in params[k]
                    ]
                    history[k][version[k]] = (
                        [p.detach().clone() for p in params[k]],
                        [None if b is None else b.clone() for b in bufs],
                    )
                    if version[k] % u_per == 0:
                        e = version[k] // u_per
                        snap.setdefault(e, {}).update(
                            {nm: p.detach().clone() for nm, p in zip(names[k], params[k])}
                        )
                        snap_count[e] = snap_count.get(e, 0) + 1
                pos[k] += 1
            keep_from = need[k][mb + 1]
            for old in [v for v in history[k] if v < keep_from and v < version[k]]:
                del history[k][old]
        while snap_count.get(recorded + 1, 0) == n:
            recorded += 1
            _record(em, ev, job, recorded, snap.pop(recorded), losses.pop(recorded - 1), keep)
            if on_epoch:
                on_epoch(em.epochs[-1])
    if recorded < epochs:
        raise RuntimeError(f"the replay reached epoch {recorded} of {epochs}")
    return em
