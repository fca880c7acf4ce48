"""Users' own models (``--model FILE.py:NAME`` / ``package.module:NAME``) in the profiler and
real runs, traces that record where and when they were measured, and ``sim run``'s warning
when a trace comes from another machine or day than the topology claims."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="user models need torch (make test installs it)")

from analysis.resolve import same_device, trace_origin_warnings  # noqa: E402
from dtsim.cli import main  # noqa: E402
from realrun.job import Job  # noqa: E402
from realrun.machine import cpu_model  # noqa: E402
from realrun.usermodel import resolve_model  # noqa: E402
from simcore.settings import ConfigError  # noqa: E402
from traces import load_trace  # noqa: E402
from traces.jsonfmt import from_dict, to_dict  # noqa: E402
from traces.model import TraceMeta  # noqa: E402

SIM = [str(Path(sys.executable).parent / "sim")]

MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn


    def mlp():
        return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))


    def cnn_with_example():
        net = nn.Sequential(
            nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
        )
        return net, torch.randn(2, 2, 8, 8)


    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.out = nn.Linear(8, 4)

        def forward(self, ids):
            return self.out(self.emb(ids).mean(1))


    def tokens():
        return Tokens(), torch.randint(0, 50, (3, 7))


    def regressor():
        return nn.Sequential(nn.Linear(6, 1), nn.Flatten(0))


    def one_output():
        return nn.Linear(6, 1)


    def not_a_model():
        return 42


    def bad_example():
        return nn.Linear(3, 3), "data"


    VALUE = 3
    """
)


@pytest.fixture()
def models(tmp_path: Path) -> Path:
    path = tmp_path / "mymodels.py"
    path.write_text(MODELS)
    return path


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out, err = capsys.readouterr()
    return int(ex.value.code or 0), out, err


# ---- resolving references -----------------------------------------------------------------


def test_a_module_with_an_input_shape(models: Path) -> None:
    m = resolve_model(f"{models}:mlp", "12")
    assert m.ref == f"{models}:mlp" and m.name == "mymodels.mlp" and m.input_shape == (12,)
    x = m.example_inputs(3, seed=1)
    assert len(x) == 1 and x[0].shape == (3, 12) and x[0].dtype == torch.float32
    assert torch.equal(x[0], m.example_inputs(3, seed=1)[0])
    assert m.build()(*x).shape == (3, 5)


def test_a_module_with_its_example_and_integer_inputs(models: Path) -> None:
    m = resolve_model(f"{models}:cnn_with_example")
    assert m.input_shape is None and m.inputs[0].shape == (2, 8, 8)
    assert m.build()(*m.example_inputs(5)).shape == (5, 3)
    t = resolve_model(f"{models}:tokens")
    ids = t.example_inputs(4)[0]
    assert ids.dtype == torch.int64 and ids.shape == (4, 7) and int(ids.max()) < 50
    assert t.inputs[0].high <= 50


def test_one_resolver_takes_zoo_names_and_references_and_the_zoo_only_its_own(
    models: Path,
) -> None:
    from realrun import zoo

    built = resolve_model(f"{models}:cnn_with_example").build()
    assert isinstance(built, torch.nn.Sequential)
    x = resolve_model(f"{models}:mlp", (12,)).example_inputs(3)
    assert x[0].shape == (3, 12)
    assert isinstance(resolve_model("mlp_small").build(), torch.nn.Module)
    with pytest.raises(KeyError):
        zoo.build("resnet51")
    with pytest.raises(KeyError):  # the zoo knows its registry, not the user's files
        zoo.build(f"{models}:cnn_with_example")


def test_a_relative_path_becomes_absolute(models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(models.parent)
    assert resolve_model("mymodels.py:mlp", (12,)).ref == f"{models}:mlp"


def test_package_module_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "umpkg_a"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    m = resolve_model("umpkg_a.nets:cnn_with_example")
    assert m.ref == "umpkg_a.nets:cnn_with_example" and m.name == "umpkg_a.nets.cnn_with_example"
    assert m.build()(*m.example_inputs(2)).shape == (2, 3)


def test_package_in_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "umpkg_c"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(MODELS)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    assert resolve_model("umpkg_c.nets:mlp", "12").inputs[0].shape == (12,)


def test_resolving_keeps_the_callers_random_state(models: Path) -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    resolve_model(f"{models}:tokens")
    assert torch.equal(torch.rand(3), expected)


def test_zoo_names_resolve_to_the_zoo() -> None:
    from realrun import zoo

    m = resolve_model("mlp_small", "999")  # a shape is ignored for the zoo
    assert m.is_zoo and m.name == "mlp_small" and m.input_shape is None
    assert torch.equal(
        m.example_inputs(2, seed=3)[0], zoo.example_inputs("mlp_small", 2, seed=3)[0]
    )


@pytest.mark.parametrize(
    "name, shape, field, words",
    [
        ("nope", None, "model", "does not define 'nope'; it defines: "),
        ("VALUE", None, "model", "VALUE is a value of type int, not a callable"),
        ("not_a_model", None, "model", "it returned a value of type int"),
        ("bad_example", None, "model", "example input is a value of type str"),
        ("mlp", None, "input_shape", "returns only a module"),
        ("mlp", "13", "input_shape", "cannot run on a batch of inputs of this shape"),
        ("mlp", "3,-1", "input_shape", "positive integers"),
    ],
)
def test_bad_references_name_the_setting(
    models: Path, name: str, shape: str | None, field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as ex:
        resolve_model(f"{models}:{name}", shape)
    assert ex.value.field == field and words in str(ex.value)
    assert "\n" not in str(ex.value)


def test_the_missing_name_lists_what_the_file_defines(models: Path) -> None:
    with pytest.raises(ConfigError) as ex:
        resolve_model(f"{models}:nope")
    listed = str(ex.value).split("it defines: ")[1]
    assert "mlp" in listed and "tokens" in listed and "Tokens" in listed
    assert "VALUE" not in listed and "torch" not in listed


def test_missing_file_import_error_and_unknown_module(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise RuntimeError('no GPU\\nhere')\n")
    cases = {
        f"{tmp_path}/absent.py:net": "no such file",
        f"{broken}:net": "importing",
        "no_such_pkg_xyz.mod:net": "no module named 'no_such_pkg_xyz'",
        "resnet51": "zoo models:",
    }
    for ref, words in cases.items():
        with pytest.raises(ConfigError) as ex:
            resolve_model(ref)
        assert words in str(ex.value) and "\n" not in str(ex.value), ref
    with pytest.raises(ConfigError, match="RuntimeError: no GPU here"):
        resolve_model(f"{broken}:net")


def test_a_job_carries_the_input_shape(models: Path) -> None:
    job = Job(scheme="dp", model=f"{models}:mlp", workers=2, input_shape=[12])
    again = Job.from_dict(json.loads(json.dumps(job.to_dict())))
    assert again == job and again.input_shape == (12,)
    assert Job.from_dict({"scheme": "dp", "model": "mlp_small", "workers": 1}).input_shape is None


def test_the_runtime_builds_batches_and_loss_for_a_user_model(models: Path) -> None:
    from realrun.runtime import batch, build_model, loss_of, output_shape

    for name, shape in (("mlp", [12]), ("regressor", [6]), ("one_output", [6])):
        job = Job(scheme="dp", model=f"{models}:{name}", workers=1, input_shape=shape)
        setup = build_model(job, torch.device("cpu"))
        assert [layer.name for layer in setup.layers]
        classes, label_shape = output_shape(job)
        inputs, labels = batch(job, 0, 0, classes, label_shape)
        loss = loss_of(setup.model(*inputs), labels)
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in setup.model.parameters())


def test_stages_of_a_user_model_compose(models: Path) -> None:
    from analysis.resolve import pipeline_plan

    plan = pipeline_plan(f"{models}:mlp", 4, 2, "gpipe", {}, input_shape=(12,))
    assert len(plan["stage_layers"]) == 2


# ---- sim profile -----------------------------------------------------------------------------


def test_profile_a_user_model_records_where(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.json"
    code, _stdout, err = run_main(
        capsys,
        "profile",
        "--model",
        f"{models}:mlp",
        "--input-shape",
        "12",
        "--batch-size",
        "4",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        str(out),
        "--no-progress",
    )
    assert code == 0, err
    trace = load_trace(str(out))
    assert trace.meta.model == "mymodels.mlp" and trace.meta.batch_size == 4
    assert trace.param_bytes == 4 * (12 * 16 + 16 + 16 * 5 + 5)
    m = trace.meta
    assert m.cpu == cpu_model() and m.cpu_cores >= 1 and len(m.machine) == 16 and m.gpu == ""
    assert "T" in m.date and m.date.endswith("+00:00")
    assert m.measured_on == m.cpu
    raw = json.loads(out.read_text())["meta"]
    assert raw["cpu"] == m.cpu and raw["cpu_cores"] == m.cpu_cores


def test_profile_with_the_models_own_example(
    models: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _stdout, err = run_main(
        capsys, "profile", "--model", "mymodels.py:cnn_with_example", "--batch-size", "2",
        "--repeats", "1", "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "mymodels.cnn_with_example-cpu-b2.json").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "{m}:nope"], "--model: '{m}:nope' is not allowed; {m} does not define 'nope'"),
        (["--model", "{m}:VALUE"], "not a callable"),
        (["--model", "{m}:not_a_model"], "must return an nn.Module"),
        (["--model", "{d}/missing.py:mlp"], "no such file"),
        (["--model", "{m}:mlp"], "--input-shape: missing"),
        (["--model", "{m}:mlp", "--input-shape", "3,x"], "--input-shape: '3,x' is not allowed"),
        (["--model", "{d}/broken.py:mlp"], "importing"),
    ],
)
def test_profile_bad_models_are_one_line(
    models: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: str,
) -> None:
    (tmp_path / "broken.py").write_text("raise ImportError('needs a package we lack')\n")
    fill = {"m": str(models), "d": str(tmp_path)}
    code, _out, err = run_main(capsys, "profile", *[a.format(**fill) for a in args])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert words.format(**fill) in lines[0]
    assert not list(tmp_path.glob("*.json"))


# ---- sim real --------------------------------------------------------------------------------


@pytest.mark.real
def test_sim_real_runs_a_user_model_and_profiles_it(models: Path, tmp_path: Path) -> None:
    prof = tmp_path / "prof.json"
    out = subprocess.run(
        [
            *SIM, "real", "--model", f"{models}:mlp", "--input-shape", "12", "--gpus", "2",
            "--scheme", "dp", "--iterations", "2", "--json", "--profile-out", str(prof),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["gpus"] == 2 and result["iteration_time_s"] > 0
    assert result["comm_bytes_total"] > 0
    meta = load_trace(str(prof)).meta
    assert meta.cpu == cpu_model() and "T" in meta.date


@pytest.mark.real
def test_sim_real_package_module_form_reaches_every_rank(tmp_path: Path) -> None:
    pkg = tmp_path / "umpkg_b"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(MODELS)
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [
            *SIM, "real", "--model", "umpkg_b.nets:cnn_with_example", "--gpus", "2",
            "--scheme", "dp", "--iterations", "1", "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["gpus"] == 2


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "{m}:nope"], "does not define 'nope'"),
        (["--model", "{m}:mlp"], "--input-shape: missing"),
        (["--model", "{m}:mlp", "--input-shape", "0"], "--input-shape: '0' is not allowed"),
        (["--model", "{m}:bad_example"], "example input"),
        (["--model", "{d}/gone.py:mlp"], "no such file"),
    ],
)
def test_sim_real_bad_models_are_one_line(
    models: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: str,
) -> None:
    fill = {"m": str(models), "d": str(tmp_path)}
    code, _out, err = run_main(
        capsys, "real", "--gpus", "2", "--scheme", "dp", *[a.format(**fill) for a in args]
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and words.format(**fill) in lines[0]


# ---- where a trace was measured --------------------------------------------------------------


def test_old_traces_load_and_new_fields_round_trip() -> None:
    old = {
        "format": "dtsim-trace",
        "version": 1,
        "meta": {"model": "m", "device": "cpu", "batch_size": 2, "date": "2026-01-02"},
        "layers": [{"name": "a", "forward_s": 1.0, "backward_s": 2.0}],
        "edges": [],
    }
    trace = from_dict(old)
    assert trace.meta.cpu == "" and trace.meta.cpu_cores == 0 and trace.meta.measured_on == "cpu"
    assert "cpu" not in to_dict(trace)["meta"]
    new = dict(old, meta=dict(old["meta"], cpu="Xeon 9", cpu_cores=8, machine="ab", gpu=""))
    again = from_dict(to_dict(from_dict(new)))
    assert (again.meta.cpu, again.meta.cpu_cores, again.meta.machine) == ("Xeon 9", 8, "ab")
    assert again.meta.measured_on == "Xeon 9"


CPU = "AMD EPYC 7B13"


def cpu_meta(date: str = "2026-11-23T01:00:00+00:00", cpu: str = CPU) -> TraceMeta:
    return TraceMeta("net", "cpu", 8, date=date, cpu=cpu, cpu_cores=2, machine="x")


def cpu_preset(model: str = CPU, date: str | None = "2026-11-23T09:00:00Z") -> dict:
    preset = {"name": "calibrated", "gpu": {"kind": "cpu", "model": model}}
    if date:
        preset["measured"] = {"date": date, "cpu": model}
    return preset


def test_no_warning_for_the_same_machine_and_day() -> None:
    assert trace_origin_warnings(cpu_meta(), cpu_preset()) == []


def test_warning_for_another_cpu() -> None:
    (w,) = trace_origin_warnings(cpu_meta(cpu="Intel Xeon Gold 6148"), cpu_preset())
    assert w.startswith("warning: net was measured on 'Intel Xeon Gold 6148'")
    assert f"claims '{CPU}'" in w


def test_warning_for_days_apart() -> None:
    (w,) = trace_origin_warnings(cpu_meta(date="2026-11-20"), cpu_preset())
    assert w.startswith("warning: ") and "3.4 days apart" in w
    import datetime

    yaml_date = cpu_preset(date=None)
    yaml_date["measured"] = {"date": datetime.date(2026, 11, 25), "cpu": CPU}
    assert len(trace_origin_warnings(cpu_meta(), yaml_date)) == 1
    assert trace_origin_warnings(cpu_meta(date=""), cpu_preset()) == []


def test_gpu_traces_warn_only_where_nothing_rescales_them() -> None:
    v100 = {"name": "pcie", "gpu": {"model": "V100", "peak_flops": 15.7e12}}
    a100 = {"name": "dgx-a100", "gpu": {"model": "A100", "peak_flops": 19.5e12}}
    assert trace_origin_warnings(TraceMeta("resnet50", "V100", 128), v100) == []
    assert trace_origin_warnings(TraceMeta("resnet50", "V100", 128), a100) == []  # rescaled
    cuda = TraceMeta("net", "NVIDIA A100-SXM4-40GB", 8, gpu="NVIDIA A100-SXM4-40GB")
    assert trace_origin_warnings(cuda, a100) == []
    assert len(trace_origin_warnings(cuda, v100)) == 1
    assert trace_origin_warnings(cuda, v100, compute_scale=2.0) == []  # deliberate
    analytic = TraceMeta("net", "analytic:1e12", 8, peak_flop_per_s=1e12, date="2020-01-01")
    assert trace_origin_warnings(analytic, v100) == []
    assert trace_origin_warnings(analytic, dict(v100, measured={"date": "2026-11-23"})) == []
    host = dict(a100, measured={"cpu": "AMD EPYC 7742", "date": "2026-11-23"})
    assert trace_origin_warnings(TraceMeta("r", "A100", 8, date="2026-11-23"), host) == []
    (w,) = trace_origin_warnings(TraceMeta("old", "cpu", 8), v100)
    assert "does not record which CPU" in w


def test_same_device_names() -> None:
    assert same_device("A100", "NVIDIA A100-SXM4-40GB")
    assert same_device("amd  epyc 7b13", CPU)
    assert not same_device("V100", "NVIDIA A100-SXM4-40GB")
    assert not same_device("cpu", CPU) and not same_device("", "")


def _preset_file(tmp_path: Path, model: str, date: str) -> Path:
    base = Path(__file__).parent.parent / "simcore/presets/topologies/ethernet.yaml"
    text = base.read_text().replace(
        "gpu: {model: V100, memory_bytes: 16GiB, memory_bandwidth_bytes_per_s: 900GB/s,\n"
        "      peak_flop_per_s: 15.7e12}",
        f'gpu: {{kind: cpu, model: "{model}", memory_bytes: 16GiB,'
        f" memory_bandwidth_bytes_per_s: 20GB/s}}\n"
        f'host: {{cores: 2}}\nmeasured: {{date: "{date}", cpu: "{model}"}}',
    )
    assert "kind: cpu" in text
    path = tmp_path / f"cal-{abs(hash((model, date)))}.yaml"
    path.write_text(text.replace("name: ethernet", "name: calibrated"))
    return path


def test_sim_run_warns_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.json"
    data = to_dict(load_trace("snn-cpu"))
    data["meta"].update(cpu=CPU, cpu_cores=2, date="2026-11-23T01:00:00+00:00")
    trace.write_text(json.dumps(data))
    args = ["run", "--model", str(trace), "--gpus", "2", "--iterations", "1", "--json"]
    same = _preset_file(tmp_path, CPU, "2026-11-23T10:00:00+00:00")
    code, out, err = run_main(capsys, *args, "--topology", str(same))
    assert code == 0 and json.loads(out)["gpus"] == 2
    assert "warning" not in err
    other = _preset_file(tmp_path, "Intel Xeon Gold 6148", "2026-11-26T10:00:00+00:00")
    code, out, err = run_main(capsys, *args, "--topology", str(other))
    assert code == 0 and json.loads(out)["gpus"] == 2
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, err
    assert "claims 'Intel Xeon Gold 6148'" in warnings[0] and "days apart" in warnings[1]
    code, out, err = run_main(capsys, "run", "--gpus", "2", "--iterations", "1")
    assert code == 0 and "warning" not in err  # the built-in V100 trace on a V100 preset


def test_input_shape_is_a_flag_a_config_key_and_a_set_key(tmp_path: Path) -> None:
    from realrun.spec import RealSpec
    from tests.test_settings import resolve

    by_flag, _ = resolve(["--input-shape", "3,32,32"], RealSpec)
    conf = tmp_path / "c.yaml"
    conf.write_text("input_shape: '3,32,32'\n")
    by_file, _ = resolve(["--config", str(conf)], RealSpec)
    by_set, _ = resolve(["--set", "input_shape=3,32,32"], RealSpec)
    assert by_flag.input_shape == by_file.input_shape == by_set.input_shape == "3,32,32"
