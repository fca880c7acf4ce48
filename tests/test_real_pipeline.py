"""The pipeline schemes for real (gloo on CPU, 2-3 ranks, small models): the model split
along the partition, the simulator's schedules executed, and the numerics against
single-process references (accumulated SGD for mp/gpipe, the schedule's weight-version
replay for pipedream/spectrain)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="real runs need torch (make test installs it)")

from analysis.resolve import pipeline_plan as plan  # noqa: E402
from realrun import zoo  # noqa: E402
from realrun.job import Job  # noqa: E402
from realrun.launch import launch  # noqa: E402
from realrun.metrics import summarize  # noqa: E402
from realrun.pipeline import (  # noqa: E402
    accumulate,
    make_schedule,
    microbatch,
    prescribed_versions,
    replay_reference,
)
from realrun.runtime import build_model, loss_of, make_optimizer  # noqa: E402
from realrun.stages import SavedBytes, split_model  # noqa: E402
from simcore import schedule as sch  # noqa: E402
from simcore.records import RECOMPUTE  # noqa: E402
from tests.test_real import simulate_same  # noqa: E402

pytestmark = pytest.mark.real


def _trace_partition(model: str, batch: int, gpus: int) -> tuple[Any, Any]:
    from realrun.profiler import ProfileConfig, profile_model
    from simcore.partition import partition

    trace = profile_model(
        model, ProfileConfig(batch_size=batch, analytic=True, device_flops=1e12, progress=False)
    )
    return trace, partition(trace, gpus, 1e9, method="antichain", straight=True)


# ---- stage modules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, gpus, batch, crossing",
    [
        ("mlp_small", 3, 4, 1),
        ("cnn_small", 3, 4, 1),
        ("resnet18", 4, 2, 2),  # the skip crosses every cut with the block's input
        ("googlenet", 4, 1, 1),
        ("densenet121", 4, 1, 4),  # the dense block's concatenation inputs
    ],
)
def test_stages_compose_to_the_whole_model(
    model: str, gpus: int, batch: int, crossing: int
) -> None:
    trace, part = _trace_partition(model, batch, gpus)
    torch.manual_seed(0)
    net = zoo.build(model)
    x = zoo.example_inputs(model, batch, seed=1)
    split = split_model(
        net, [s.layers for s in part.stages], x, [layer.name for layer in trace.layers]
    )
    assert len(split.stages) == gpus
    assert max(len(b) for b in split.boundaries) >= crossing
    torch.manual_seed(7)
    out_ref = net(*x)
    first = next(iter(out_ref)) if isinstance(out_ref, tuple) else out_ref
    first.float().pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    net.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    h: Any = x
    for st in split.stages:
        h = st(*h)
    out = next(iter(h)) if isinstance(h, tuple) else h
    torch.testing.assert_close(out, first)
    out.float().pow(2).mean().backward()
    owners = [n for st in split.stages for n in st.param_names]
    assert sorted(owners) == sorted(n for n, _p in net.named_parameters())
    for n, p in net.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], msg=n)


# ---- runs ------------------------------------------------------------------------------


def run(
    tmp_path: Path,
    scheme: str,
    gpus: int,
    model: str = "mlp_small",
    batch: int = 12,
    options: dict[str, Any] | None = None,
    pipeline: dict[str, Any] | None = None,
    **kw: Any,
) -> tuple[dict[str, Any], dict[str, Any], Job]:
    options = options or {}
    pipeline = pipeline or plan(model, batch, gpus, scheme, options)
    kw.setdefault("iterations", 2)
    kw.setdefault("lr", 0.05)
    job = Job(
        scheme=scheme,
        model=model,
        workers=gpus,
        options=options,
        pipeline=pipeline,
        batch_size=batch,
        save_weights=True,
        timeout_s=60.0,
        **kw,
    )
    records = launch(job, str(tmp_path))
    return records, summarize(records), job


def stage_weights(tmp_path: Path, records: dict[str, Any]) -> dict[str, Any]:
    """Each parameter from the rank that trains it (the first replica)."""
    out: dict[str, Any] = {}
    for r in sorted(records["ranks"], key=lambda r: r["rank"]):
        w = torch.load(tmp_path / f"weights-rank{r['rank']}.pt")
        for n in r["stage_params"]:
            out.setdefault(n, w[n])
    return out


def accumulated_sgd(job: Job) -> dict[str, Any]:
    """One process, the whole model: per iteration the micro-batches' losses over ``M``,
    gradients accumulated, one step."""
    setup = build_model(job, torch.device("cpu"))
    model = setup.model
    opt = make_optimizer(job, list(model.parameters()))
    m = job.pipeline["microbatches"]
    cache: dict[int, Any] = {}
    for it in range(job.total_iterations):
        opt.zero_grad(set_to_none=True)
        for j in range(m):
            x, y = microbatch(job, it * m + j, m, cache)
            (loss_of(model(*x), y) / m).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_params(real: dict[str, Any], ref: dict[str, Any], job: Job, atol: float = 2e-6) -> None:
    assert real.keys() == ref.keys()
    for k in real:
        torch.testing.assert_close(real[k], ref[k], atol=atol, rtol=1e-5, msg=k)
    init = dict(build_model(job, torch.device("cpu")).model.named_parameters())
    assert any(not torch.equal(ref[k], init[k]) for k in ref), "the weights never moved"


def assert_versions(records: dict[str, Any], job: Job) -> None:
    """Each real pass used the weight version the schedule prescribes."""
    p = job.pipeline
    sched = make_schedule(
        job.scheme, job.options, p["replicas"], p["microbatches"], job.total_iterations + p["tail"]
    )
    for r in records["ranks"]:
        got = [tuple(x) for x in r["passes"]]
        assert got == prescribed_versions(sched, r["rank"]), f"rank {r['rank']}"


def test_accumulated_gradients_stay_apart_when_autograd_shares_one() -> None:
    # a + b: autograd hands both weights the same gradient tensor; summing in place must
    # not add b's gradient into a's sum
    a = torch.zeros(3, requires_grad=True)
    b = torch.zeros(3, requires_grad=True)
    sums: list[Any] = [None, None]
    for scale in (1.0, 2.0):  # two micro-batches
        grads = torch.autograd.grad(a + b, [a, b], torch.full((3,), scale))
        assert grads[0] is grads[1]
        accumulate(sums, grads)
    assert torch.equal(sums[0], torch.full((3,), 3.0))
    assert torch.equal(sums[1], torch.full((3,), 3.0))
    assert sums[0].untyped_storage().data_ptr() != sums[1].untyped_storage().data_ptr()
    accumulate(sums, [None, torch.ones(3)])  # a weight without a gradient keeps its sum
    assert torch.equal(sums[0], torch.full((3,), 3.0))
    assert torch.equal(sums[1], torch.full((3,), 4.0))


@pytest.mark.parametrize(
    "scheme, gpus, model, batch, options",
    [
        ("mp", 3, "mlp_small", 8, {}),
        ("gpipe", 2, "cnn_small", 8, {}),
        ("gpipe", 3, "mlp_small", 12, {"recompute": True}),
        ("gpipe", 2, "resnet18", 2, {"microbatches": 2}),  # two tensors cross the cut
        ("1f1b", 3, "mlp_small", 12, {}),
        ("zb-h1", 3, "mlp_small", 12, {}),  # I and W apart, W held back on the last ranks
        # several stages per rank: looped, and in a V (the turn stays on the rank)
        ("interleaved", 2, "mlp_small", 8, {}),
        ("looped-bfs", 2, "mlp_small", 8, {}),
        ("zb-interleaved", 2, "mlp_small", 8, {}),
        ("zbv", 2, "mlp_small", 8, {}),
        ("dualpipev", 2, "mlp_small", 8, {}),
    ],
)
def test_mp_and_gpipe_equal_accumulated_sgd(
    tmp_path: Path, scheme: str, gpus: int, model: str, batch: int, options: dict[str, Any]
) -> None:
    records, result, job = run(tmp_path, scheme, gpus, model, batch, options)
    ref = accumulated_sgd(job)
    assert_params(stage_weights(tmp_path, records), ref, job)
    assert_versions(records, job)
    assert result["microbatches"] == job.pipeline["microbatches"]
    assert result["global_batch_size"] == batch
    assert all(b == 0 for b in result["stash_peak_bytes"])
    assert all(b > 0 for b in result["activation_peak_bytes"])


@pytest.mark.parametrize(
    "scheme, options",
    [
        ("pipedream", {"straight": True}),
        ("pipedream", {"straight": True, "stash": False}),
        ("spectrain", {}),
    ],
)
def test_async_pipelines_equal_the_weight_version_replay(
    tmp_path: Path, scheme: str, options: dict[str, Any]
) -> None:
    records, result, job = run(tmp_path, scheme, 3, "mlp_small", 12, options)
    ref, passes = replay_reference(job)
    real = stage_weights(tmp_path, records)
    assert_params(real, {k: ref[k] for k in real}, job)
    assert_versions(records, job)
    for r in records["ranks"]:
        assert sorted(map(tuple, r["passes"])) == sorted(map(tuple, passes[r["stage"]]))
    # a backward at other weights than its forward's re-runs the forward first, in a
    # span of its own (the simulator's re-run on CPU hosts); with the stash it cannot
    other = scheme == "spectrain" or not options.get("stash", True)
    for r in records["ranks"]:
        reruns = [s for s in r["spans"] if s[2] == RECOMPUTE and s[3].endswith(" rerun")]
        backwards = [p for p in r["passes"] if p[1] == sch.BACKWARD]
        assert len(reruns) == (len(backwards) if other else 0)
    stash = result["stash_peak_bytes"]
    if options.get("stash", scheme == "pipedream"):
        # stage k keeps N - k - 1 older versions (a stage without weights keeps nothing)
        per_copy = sum(real[n].numel() * 4 for n in records["ranks"][0]["stage_params"])
        assert stash[0] == 2 * per_copy
        assert stash[-1] == 0
    else:
        assert stash == [0, 0, 0]


def test_replicated_stage_replicas_stay_identical_and_equal_the_replay(tmp_path: Path) -> None:
    _trace, part = _trace_partition("mlp_small", 8, 2)
    pipeline = {
        "stage_layers": [list(s.layers) for s in part.stages],
        "replicas": [2, 1],
        "microbatches": 4,
        "tail": 1,
        "partition": "antichain",
    }
    records, _result, job = run(tmp_path, "pipedream", 3, "mlp_small", 8, {}, pipeline=pipeline)
    assert_versions(records, job)
    ref, _passes = replay_reference(job)
    real = stage_weights(tmp_path, records)
    assert_params(real, {k: ref[k] for k in real}, job)
    w0, w1 = (torch.load(tmp_path / f"weights-rank{r}.pt") for r in (0, 1))
    own = next(r for r in records["ranks"] if r["rank"] == 0)["stage_params"]
    init = dict(build_model(job, torch.device("cpu")).model.named_parameters())
    for n in own:
        assert torch.equal(w0[n], w1[n]), n
    assert any(not torch.equal(w0[n], init[n]) for n in own)
    # each replica ran every other micro-batch
    mbs = {r["rank"]: {p[0] for p in r["passes"]} for r in records["ranks"]}
    assert mbs[0].isdisjoint(mbs[1]) and mbs[0] | mbs[1] == mbs[2]


# ---- traffic, memory and timelines against the simulator --------------------------------


@pytest.mark.parametrize(
    "scheme, options, gpus",
    [
        ("gpipe", {}, 3),
        ("pipedream", {"straight": True}, 3),
        ("spectrain", {}, 3),
        ("zb-h1", {}, 3),
        ("interleaved", {}, 2),
        ("zbv", {}, 2),  # the V's turn stays on rank 1: no message
    ],
)
def test_bytes_and_stash_memory_equal_the_simulators(
    tmp_path: Path, scheme: str, options: dict[str, Any], gpus: int
) -> None:
    records, real, job = run(tmp_path, scheme, gpus, "mlp_small", 4 * gpus, options)
    sim = simulate_same(tmp_path, job)
    # the ranks' records share one zero: no message is received before it was sent
    from realrun.runtime import RECV, SEND

    spans = [s for r in records["ranks"] for s in r["spans"] if s[10] >= 0]
    pairs = 0
    for flow in {s[10] for s in spans if s[1] == SEND}:
        starts = sorted(s[4] for s in spans if s[1] == SEND and s[10] == flow)
        ends = sorted(s[5] for s in spans if s[1] == RECV and s[10] == flow)
        assert len(starts) == len(ends)
        assert all(end >= start for start, end in zip(starts, ends, strict=True))
        pairs += len(ends)
    assert pairs > 0
    assert sim.extra["microbatches"] == real["microbatches"]
    assert sim.extra["stage_replicas"] == real["stage_replicas"]
    assert real["comm_bytes_per_iteration"] == sim.comm_bytes_per_iteration
    assert real["stash_peak_bytes"] == sim.extra["stash_peak_bytes"]


def test_the_saved_bytes_leave_out_the_weights_and_the_inputs() -> None:
    """A stage's kept bytes are what autograd saves beside what the stage holds anyway:
    ``Linear`` then ``ReLU`` keeps the ReLU's output (the Linear's saved input and weight
    are the stage's input and weights)."""
    lin = torch.nn.Linear(64, 128)
    x = torch.randn(4, 64, requires_grad=True)
    counter = SavedBytes([*lin.parameters(), x])
    with counter.hooks():
        torch.relu(lin(x))
    assert counter.nbytes == 4 * 128 * 4
    everything = SavedBytes()
    with everything.hooks():
        torch.relu(lin(x))
    assert everything.nbytes == counter.nbytes + 64 * 128 * 4 + 4 * 64 * 4


def test_cli_pipedream_json_and_trace(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from simcore.result import CONTRACT_KEYS

    trace_out = tmp_path / "t.json"
    sim = str(Path(sys.executable).parent / "sim")
    out = subprocess.run(
        [
            sim,
            "real",
            "--gpus",
            "3",
            "--scheme",
            "pipedream",
            "--model",
            "mlp_small",
            "--batch-size",
            "12",
            "--set",
            "scheme.straight=true",
            "--iterations",
            "2",
            "--json",
            "--trace-out",
            str(trace_out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(CONTRACT_KEYS) <= set(result)
    assert result["gpus"] == 3 and result["global_batch_size"] == 12
    assert result["stash_peak_bytes"][0] > 0
    assert len(result["activation_peak_bytes"]) == 3
    chrome = json.loads(trace_out.read_text())
    cats = {e.get("cat") for e in chrome["traceEvents"] if e.get("ph") == "X"}
    assert {"forward", "backward", "send", "recv", "update"} <= cats
    assert any(e.get("ph") == "s" for e in chrome["traceEvents"])  # flow arrows
    # one span per layer and pass, named as the trace's (and sim run's) layers
    names = {(e.get("cat"), e.get("name")) for e in chrome["traceEvents"] if e.get("ph") == "X"}
    assert {("forward", "head"), ("backward", "head"), ("backward", "body.0")} <= names


@pytest.mark.parametrize(
    "scheme",
    ["gpipe", "1f1b", "zb-h1", "interleaved", "looped-bfs", "zb-interleaved", "zbv", "dualpipev"],
)
def test_pipelines_equal_torch_pipelining_on_the_same_split(tmp_path: Path, scheme: str) -> None:
    """torch.distributed.pipelining's own schedule over the same stages (GPipe,
    Schedule1F1B, ScheduleInterleavedZeroBubble for ZB-H1's split backward): same
    micro-batch losses, and (one SGD step) the same weights, so the same gradients."""
    import os
    import socket
    import subprocess
    import sys

    records, _result, job = run(
        tmp_path,
        scheme,
        2,
        "mlp_small",
        8,
        {"microbatches": 4},
        iterations=1,
        warmup_iterations=0,
        optimizer="sgd",
    )
    job.write(tmp_path / "pp-job.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = str(Path(__file__).parent / "pipelining_crosscheck.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(tmp_path / "pp-job.json"), str(tmp_path)],
            env=dict(
                os.environ,
                RANK=str(r),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                PYTHONPATH=str(Path(__file__).parent.parent),
            ),
        )
        for r in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    theirs = [torch.load(tmp_path / f"torchpp-rank{r}.pt") for r in range(2)]
    ours = stage_weights(tmp_path, records)
    for t in theirs:
        for n, w in t["weights"].items():
            torch.testing.assert_close(ours[n], w, atol=1e-6, rtol=1e-5, msg=n)
    assert sorted(n for t in theirs for n in t["weights"]) == sorted(ours)
    end = len(job.pipeline["replicas"]) - 1  # the last stage: rank 1, or rank 0 in a V
    last = next(r for r in records["ranks"] if end in r["stages"])
    assert theirs[last["rank"]]["losses"]
    assert [x for _mb, x in last["losses"]] == pytest.approx(
        theirs[last["rank"]]["losses"], rel=1e-6
    )


@pytest.mark.parametrize(
    "scheme, fault, words",
    [
        ("gpipe", "hang:1:1", "rank 1 (worker) hung"),
        ("pipedream", "kill:2:1", "rank 2 (worker) was killed by SIGKILL"),
    ],
)
def test_dead_or_hung_pipeline_rank_is_named(
    tmp_path: Path, scheme: str, fault: str, words: str
) -> None:
    import subprocess

    from realrun.launch import RankFailed

    options = {"straight": True} if scheme == "pipedream" else {}
    job = Job(
        scheme=scheme,
        model="mlp_small",
        workers=3,
        options=options,
        pipeline=plan("mlp_small", 12, 3, scheme, options),
        batch_size=12,
        iterations=3,
        timeout_s=4.0,
        fault=fault,
    )
    with pytest.raises(RankFailed) as info:
        launch(job, str(tmp_path))
    assert words in str(info.value)
    out = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert out.stdout.strip() == "", "a rank process outlived the run"


def test_a_rank_waiting_for_a_posted_receive_is_waiting_not_hung():
    """The hang diagnosis names the rank that is not waiting for others: a main thread in
    a posted receive (pipelines, gossip) or the messenger waits; one in its own code (or
    asleep, as the fault hook) is not."""
    from realrun.launch import waits_for_others

    def dump(*frames: str) -> str:
        lines = "\n".join(f'  File "/x/{f}", line 1 in f' for f in frames)
        other = 'Thread 0x1 (most recent call first):\n  File "/x/realrun/p2p.py"\n\n'
        return f"{other}Current thread 0x2 (most recent call first):\n{lines}\n"

    assert waits_for_others(dump("realrun/p2p.py", "realrun/pipeline.py"))
    assert waits_for_others(dump("realrun/runtime.py", "realrun/schemes/ps.py"))
    assert not waits_for_others(dump("realrun/worker.py", "realrun/pipeline.py"))
    assert not waits_for_others("")


def test_a_micro_batch_count_a_schedule_cannot_take_is_refused_before_any_rank_starts():
    from simcore.config import ConfigError

    with pytest.raises(ConfigError, match=r"scheme.microbatches: 3 .*DualPipeV.*use 4 or more"):
        plan("mlp_small", 6, 2, "dualpipev", {"microbatches": 3})
