"""What-if sweeps: the cross product of values of any :class:`~simcore.spec.RunSpec` field.

A sweep is a base spec plus *axes*: a field name (``scheme``, ``gpus``, ``bandwidth``...,
or ``scheme.KEY`` for a scheme option) and the values it takes. :func:`plan_sweep` checks
every value up front (a bad value is an error naming the field, the value and what is
allowed, before anything runs) and expands the cross product into :class:`Point`\\ s; a
scheme option is applied only to the points whose scheme takes it (``--scheme dp,ps --set
scheme.algorithm=ring,tree`` runs ``dp`` twice and ``ps`` once).

:func:`run_sweep` runs the points that its output does not hold yet, in-process
(``jobs=1``), in local worker processes (joblib) or on a Dask cluster (``scheduler``);
each finished point is appended to the output's journal at once (see
:mod:`analysis.store`), and a point that fails is recorded with its error while the
others go on.

A point is identified by a hash of its whole spec (:func:`point_id`), so rerunning a sweep
(or a larger one into the same file) computes only what is missing.

Rows: ``point_id``, ``status`` (``ok`` or ``error``), the swept fields under their names
(plus ``bandwidth_bytes_per_s`` when ``bandwidth`` is swept), every key of ``sim run
--json`` (see :func:`flatten_result`), ``error`` (one line, empty when ok) and ``spec``
(the point's whole spec as JSON, enough to rerun it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from analysis.store import FLATTENED, flatten_result, unflatten_row
from simcore.config import ConfigError, parse_field
from simcore.settings import UNIT_KINDS, kind_of
from simcore.spec import FIELDS, RunSpec, apply_settings

__all__ = [
    "FLATTENED",
    "Point",
    "SweepPlan",
    "SweepSummary",
    "flatten_result",
    "plan_sweep",
    "point_id",
    "run_sweep",
    "split_values",
    "unflatten_row",
]

OPTION_PREFIX = "scheme."


CONNECT_TIMEOUT_S = 10.0
"""How long :func:`run_dask` waits for the scheduler to answer."""

_VALIDATED = ("model", "topology")
"""Fields whose values name files or presets (checked up front)."""


@dataclass(frozen=True)
class Point:
    """One simulation of a sweep.

    Attributes:
        point_id: stable hash of ``spec`` (see :func:`point_id`).
        values: the swept fields of this point, by name (``None`` for a scheme option
            the point's scheme does not take).
        spec: the whole spec of the run.
    """

    point_id: str
    values: Mapping[str, Any]
    spec: RunSpec


@dataclass(frozen=True)
class SweepPlan:
    """A checked sweep: its base spec, axes (name -> values, in order) and points."""

    base: RunSpec
    axes: Mapping[str, tuple[Any, ...]]
    points: tuple[Point, ...]

    @property
    def swept(self) -> tuple[str, ...]:
        """The swept field names, in order."""
        return tuple(self.axes)


@dataclass(frozen=True)
class SweepSummary:
    """What :func:`run_sweep` did.

    Attributes:
        points: points in the plan.
        skipped: points the output already held.
        computed: points run now.
        failed: points run now that failed.
        rows: rows in the output afterwards (earlier sweeps into the same file included).
        out: the output path.
        wall_s: seconds :func:`run_sweep` took.
        errors: ``(point values, error)`` of the points that failed now.
    """

    points: int
    skipped: int
    computed: int
    failed: int
    rows: int
    out: str
    wall_s: float
    errors: tuple[tuple[Mapping[str, Any], str], ...] = ()
    failed_before: int = 0
    """Points of the plan that had failed in an earlier run and were not run again."""


# ---- planning ---------------------------------------------------------------------------


def split_values(name: str, text: Any) -> tuple[Any, ...]:
    """``"1Gbps, 10Gbps"`` -> ``("1Gbps", "10Gbps")``; a list or tuple is taken as it is.
    ``ConfigError`` for empty items."""
    if isinstance(text, list | tuple):
        items = tuple(text)
    else:
        items = tuple(s.strip() for s in str(text).split(","))
    if not items or any(isinstance(s, str) and not s for s in items):
        raise ConfigError(
            name,
            text,
            "expected a comma-separated list of values without empty items, e.g. 1Gbps,10Gbps",
        )
    return items


def _normalise(key: str) -> str:
    key = key.strip()
    return key if key.startswith(OPTION_PREFIX) else key.replace("-", "_")


def _check_named(name: str, value: Any) -> None:
    """Check a value that names a model or a topology preset (the spec checks the rest)."""
    from analysis.resolve import load_preset, resolve_trace

    if name == "model":
        resolve_trace(value)
    elif name == "topology":
        load_preset(value)


def _option_fields(scheme: str) -> dict[str, dataclasses.Field]:
    from simcore.schemes import get_scheme

    return {f.name: f for f in dataclasses.fields(get_scheme(scheme).Options)}


def point_id(spec: RunSpec) -> str:
    """Stable 16-hex-digit hash of the whole spec (field values as written)."""
    text = json.dumps(spec.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_sweep(base: RunSpec, axes: Mapping[str, Sequence[Any]]) -> SweepPlan:
    """Check ``axes`` (field name or ``scheme.KEY`` -> values) against ``base`` and expand
    their cross product, in axis order, into points (duplicates dropped).

    Raises ``ConfigError`` naming the field, the value and what is allowed for an unknown
    field, an empty or repeated value, a value of the wrong type or unit, an unknown
    scheme, model or topology, and a scheme option that none of the swept schemes takes.
    """
    norm: dict[str, tuple[Any, ...]] = {}
    for key, values in axes.items():
        name = _normalise(key)
        if name in norm:
            raise ConfigError(name, values, "is swept twice; give its values once")
        is_option = name.startswith(OPTION_PREFIX) and len(name) > len(OPTION_PREFIX)
        if not is_option and (name not in FIELDS or name == "scheme_options"):
            known = ", ".join(n for n in FIELDS if n != "scheme_options")
            raise ConfigError(name, values, f"known: {known}, scheme.KEY", unknown=True)
        vals = split_values(name, values)
        norm[name] = vals

    # Spec fields: convert each value as sim run would, then check names. A value with a
    # unit is shown as written (``10Gbps``); the spec holds it converted.
    converted: dict[str, tuple[Any, ...]] = {}
    shown: dict[str, tuple[Any, ...]] = {}
    for name, vals in norm.items():
        if name.startswith(OPTION_PREFIX):
            continue
        out = tuple(getattr(apply_settings(base, {name: v}), name) for v in vals)
        for v in out:
            _check_named(name, v)
        converted[name] = out
        shown[name] = vals if kind_of(FIELDS[name]) in UNIT_KINDS else out
    for name in _VALIDATED:
        if name not in converted:
            _check_named(name, getattr(base, name))
    for name, vals in {**norm, **converted}.items():
        repeated = [v for i, v in enumerate(vals) if v in vals[:i]]
        if repeated:
            raise ConfigError(name, repeated[0], "is listed twice; give each value once")

    # Scheme options: each must be taken by at least one swept scheme, and parse there.
    schemes = converted.get("scheme", (base.scheme,))
    fields_of = {s: _option_fields(s) for s in schemes}
    base_opts = dict(base.scheme_options)
    option_values = {k: (v,) for k, v in base_opts.items()}
    option_values.update(
        {k[len(OPTION_PREFIX) :]: v for k, v in norm.items() if k.startswith(OPTION_PREFIX)}
    )
    for key, vals in option_values.items():
        takers = [s for s in schemes if key in fields_of[s]]
        if not takers:
            theirs = sorted({f for s in schemes for f in fields_of[s]})
            raise ConfigError(
                OPTION_PREFIX + key,
                vals[0],
                f"none of the swept schemes ({', '.join(schemes)}) takes this "
                f"option; theirs: {', '.join(theirs) or '(none)'}",
                unknown=True,
            )
        for s in takers:
            for v in vals:
                parse_field(fields_of[s][key], v, OPTION_PREFIX + key)

    names = list(norm)
    lists = [
        tuple(zip(converted.get(n, norm[n]), shown.get(n, norm[n]), strict=True)) for n in names
    ]
    plain = dataclasses.replace(base, scheme_options=MappingProxyType({}))
    points: dict[str, Point] = {}
    for combo in itertools.product(*lists):
        typed = {n: v for n, (v, _s) in zip(names, combo, strict=True)}
        values = {n: s for n, (_v, s) in zip(names, combo, strict=True)}
        scheme = typed.get("scheme", base.scheme)
        takes = fields_of[scheme]
        opts = {k: v for k, v in base_opts.items() if k in takes}
        settings: dict[str, Any] = {}
        for name, v in typed.items():
            if name.startswith(OPTION_PREFIX):
                if name[len(OPTION_PREFIX) :] in takes:
                    opts[name[len(OPTION_PREFIX) :]] = v
                else:
                    values[name] = None
            else:
                settings[name] = v
        settings["scheme_options"] = opts
        spec = apply_settings(plain, settings)
        pid = point_id(spec)
        points.setdefault(pid, Point(pid, MappingProxyType(values), spec))
    return SweepPlan(
        base, MappingProxyType({n: shown.get(n, norm[n]) for n in names}), tuple(points.values())
    )


# ---- one point ---------------------------------------------------------------------------


def one_line(exc: BaseException) -> str:
    """An exception as one line: ``Type: message`` (whitespace collapsed)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_point(pid: str, values: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate one point in this process and return its row (see module docs). Never
    raises for a failing simulation: the row then has ``status`` ``error`` and the
    error in one line."""
    from analysis.resolve import build_config
    from simcore.engine import simulate

    row: dict[str, Any] = {"point_id": pid, "status": "ok"}
    run_spec = None
    try:
        from simcore.guard import machine_memory, work_refusal

        run_spec = apply_settings(RunSpec(), spec)
        config = build_config(run_spec, record_spans=False)
        too_big = work_refusal(config, machine_memory())
        if too_big:  # a point too big for this machine fails at once
            raise ValueError(too_big)
        result = simulate(config)
        row.update(flatten_result(result.to_dict()))
        error = ""
    except Exception as exc:
        row["status"] = "error"
        error = one_line(exc)
    row.update(values)
    if values.get("bandwidth") and run_spec is not None:
        row["bandwidth_bytes_per_s"] = run_spec.bandwidth
    row["error"] = error
    row["spec"] = json.dumps(dict(spec), sort_keys=True, separators=(",", ":"), default=str)
    return row


def _task(p: Point) -> tuple[str, dict[str, Any], dict[str, Any]]:
    return p.point_id, dict(p.values), p.spec.to_dict()


def error_row(p: Point, exc: BaseException) -> dict[str, Any]:
    """The row of a point whose worker failed outside :func:`run_point` (a lost worker)."""
    pid, values, spec = _task(p)
    return {
        "point_id": pid,
        "status": "error",
        **values,
        "error": one_line(exc),
        "spec": json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str),
    }


# ---- runners -----------------------------------------------------------------------------


def run_in_process(points: Sequence[Point]) -> Iterator[dict[str, Any]]:
    """Rows of ``points``, one after the other, in this process."""
    for p in points:
        yield run_point(*_task(p))


def run_joblib(points: Sequence[Point], jobs: int) -> Iterator[dict[str, Any]]:
    """Rows of ``points`` from ``jobs`` local worker processes (joblib's loky backend;
    ``-1``: one per core), in the order they finish."""
    from joblib import Parallel, delayed

    par = Parallel(n_jobs=jobs, return_as="generator_unordered", batch_size="auto")
    yield from par(delayed(run_point)(*_task(p)) for p in points)


def run_points(tasks: Sequence[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of several points, one after the other (one Dask task)."""
    return [run_point(*t) for t in tasks]


DASK_TASK_S = 0.25
"""Target duration of one Dask task: short points are grouped until a task takes about
this long (a task has milliseconds of overhead); points longer than this go one by one."""

DASK_MAX_GROUP = 64


def run_dask(points: Sequence[Point], scheduler: str) -> Iterator[dict[str, Any]]:
    """Rows of ``points`` from the Dask distributed cluster at ``scheduler``
    (``tcp://HOST:PORT``), in the order they finish.

    The first tasks hold one point each; from the simulation times they report, later
    tasks group points to last about :data:`DASK_TASK_S`. Two tasks per worker are kept
    in flight. A task whose worker is lost yields error rows for its points."""
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise ConfigError(
            "scheduler", scheduler, "needs dask.distributed: pip install 'dtsim[dist]'"
        ) from None
    try:
        client = Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(
            "scheduler", scheduler, f"no Dask scheduler answers there ({one_line(exc)})"
        ) from None
    try:
        queue = list(reversed(points))
        group = 1
        tasks: dict[Any, list[Point]] = {}
        done = as_completed(loop=client.loop, with_results=True, raise_errors=False)

        def fill() -> None:
            workers = max(1, len(client.scheduler_info().get("workers", {})))
            while queue and done.count() < 2 * workers:
                batch = [queue.pop() for _ in range(min(group, len(queue)))]
                fut = client.submit(
                    run_points,
                    [_task(p) for p in batch],
                    pure=False,
                    key=f"dtsim-{batch[0].point_id}-{len(batch)}",
                )
                tasks[fut] = batch
                done.add(fut)

        fill()
        for fut, result in done:
            batch = tasks.pop(fut)
            if fut.status == "finished":
                rows = result
            else:  # the worker was lost or the task cancelled, not the simulation
                exc = result[1] if isinstance(result, tuple) else result
                rows = [error_row(p, exc) for p in batch]
            fut.release()
            times = [r["wall_s"] for r in rows if isinstance(r.get("wall_s"), float)]
            if times:
                per_point = max(sum(times) / len(times), 1e-6)
                group = max(1, min(DASK_MAX_GROUP, int(DASK_TASK_S / per_point)))
            fill()
            yield from rows
    finally:
        client.close()


Runner = Callable[[Sequence[Point]], Iterator[dict[str, Any]]]


def choose_runner(jobs: int = 1, scheduler: str | None = None) -> Runner:
    """The runner for ``jobs`` local workers, or for a Dask ``scheduler`` address."""
    if scheduler:
        return lambda points: run_dask(points, scheduler)
    if jobs == 0 or jobs < -1:
        raise ConfigError(
            "jobs", jobs, "expected a positive number of workers, or -1 for one per core"
        )

    def local(points: Sequence[Point]) -> Iterator[dict[str, Any]]:
        if jobs == 1 or len(points) < 2:
            return run_in_process(points)
        return run_joblib(points, jobs)

    return local


# ---- the sweep ---------------------------------------------------------------------------


def run_sweep(
    plan: SweepPlan,
    out: str,
    *,
    jobs: int = 1,
    scheduler: str | None = None,
    retry_failed: bool = False,
    progress: bool = False,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    runner: Runner | None = None,
) -> SweepSummary:
    """Run the points of ``plan`` that ``out`` (``.parquet`` or ``.csv``) does not hold
    yet (failed ones too with ``retry_failed``), appending each row as it finishes, and
    write ``out`` whole at the end (also when interrupted). ``on_row`` sees each new
    row; ``runner`` overrides the one chosen from ``jobs`` / ``scheduler``."""
    from analysis.store import SweepStore

    t0 = time.perf_counter()
    run = runner or choose_runner(jobs, scheduler)
    with SweepStore(out) as store:
        done = store.rows
        todo = [
            p
            for p in plan.points
            if p.point_id not in done or (retry_failed and done[p.point_id].get("status") != "ok")
        ]
        store.first = (
            "point_id",
            "status",
            *plan.swept,
            *(["bandwidth_bytes_per_s"] if "bandwidth" in plan.axes else []),
        )
        bar = _progress(len(todo), progress)
        failed: list[tuple[Mapping[str, Any], str]] = []
        computed = 0
        try:
            for row in run(todo) if todo else ():
                store.append(row)
                computed += 1
                if row["status"] != "ok":
                    failed.append(({k: row.get(k) for k in plan.swept}, row["error"]))
                if bar is not None:
                    bar.update(1)
                    if failed:
                        bar.set_postfix(failed=len(failed), refresh=False)
                if on_row is not None:
                    on_row(row)
        finally:
            if bar is not None:
                bar.close()
            store.save()
        rows = len(store.rows)
        again = {p.point_id for p in todo}
        before = sum(
            1
            for p in plan.points
            if p.point_id not in again
            and p.point_id in done
            and done[p.point_id].get("status") != "ok"
        )
    return SweepSummary(
        points=len(plan.points),
        skipped=len(plan.points) - len(todo),
        computed=computed,
        failed=len(failed),
        rows=rows,
        out=out,
        wall_s=time.perf_counter() - t0,
        errors=tuple(failed),
        failed_before=before,
    )


def _progress(total: int, enabled: bool) -> Any:
    if not enabled or total == 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="pt", desc="sweep", dynamic_ncols=True, leave=False)
