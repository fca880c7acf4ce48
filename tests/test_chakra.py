"""Chakra execution traces: export of a run, import into a layer trace, the round trip
through the simulator, chakra's own reader on every file written, a PyTorch run recorded
here and imported, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dtsim.cli import cli

try:
    import chakra.schema.protobuf.et_def_pb2 as pb
except ImportError:  # the chakra extra is absent
    pb = None

needs_chakra = pytest.mark.skipif(
    pb is None, reason="mlc-chakra is not installed (pip install -e '.[chakra]')"
)


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("Error:"), result.output
    assert "Traceback" not in result.output
    for n in needles:
        assert n in lines[-1], lines[-1]
    return lines[-1]


RUN = ("run", "--gpus", "4", "--set", "iterations=2", "--set", "warmup_iterations=1", "--json")


def _export(tmp_path: Path, scheme: str, model: str, *extra: str) -> tuple[dict, Path]:
    out = tmp_path / f"et-{scheme}"
    r = _run(*RUN, "--scheme", scheme, "--model", model, *extra, "--chakra-out", str(out))
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout[r.stdout.index("{") :]), out


@needs_chakra
@pytest.mark.parametrize(
    ("scheme", "model", "extra"),
    [
        ("dp", "alexnet", ()),
        ("gpipe", "alexnet", ("--set", "fidelity=analytic")),
        ("p3", "resnet18", ("--set", "fidelity=analytic")),
        ("pipedream", "resnet18", ("--set", "fidelity=analytic")),
        ("gossip", "resnet18", ("--set", "fidelity=analytic")),
    ],
)
def test_round_trip_same_iteration_time_and_bytes(tmp_path: Path, scheme, model, extra) -> None:
    from traces import load_builtin
    from traces.chakra import load

    first, out = _export(tmp_path, scheme, model, *extra)
    original, imported = load_builtin(model), load(out)
    assert [x.name for x in imported.layers] == [x.name for x in original.layers]
    assert imported.edges == original.edges
    assert imported.param_bytes == original.param_bytes
    again = _run(*RUN, "--scheme", scheme, "--model", str(out), *extra)
    assert again.exit_code == 0, again.output
    second = json.loads(again.stdout[again.stdout.index("{") :])
    assert second["iteration_time_s"] == pytest.approx(first["iteration_time_s"], rel=1e-9)
    assert second["comm_bytes_total"] == first["comm_bytes_total"]
    assert second["peak_memory_bytes"] == first["peak_memory_bytes"]
    for f in sorted(out.glob("*.et")):  # chakra's own decoder reads every message written
        assert _chakra_node_count(f) == _chakra_metadata(f)["dtsim.node_count"]


def _chakra_metadata(path: Path) -> dict:
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    fh = openFileRd(str(path))
    meta = pb.GlobalMetadata()
    assert decodeMessage(fh, meta)
    fh.close()
    return {a.name: getattr(a, a.WhichOneof("value")) for a in meta.attr}


def _chakra_node_count(path: Path) -> int:
    """Nodes in an ET as chakra's Python API (protolib) decodes it."""
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    fh = openFileRd(str(path))
    decodeMessage(fh, pb.GlobalMetadata())
    count, node = 0, pb.Node()
    while decodeMessage(fh, node):
        assert node.type != pb.INVALID_NODE and node.name
        count += 1
    fh.close()
    return count


def _jsonize(path: Path, tmp_path: Path) -> list[dict]:
    """The messages of an ET as chakra's own reader (chakra_jsonizer) prints them."""
    out = tmp_path / (path.name + ".json")
    tool = Path(sys.executable).with_name("chakra_jsonizer")
    subprocess.run(
        [str(tool), "--input_filename", str(path), "--output_filename", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    text, pos, msgs = out.read_text(), 0, []
    decoder = json.JSONDecoder()
    while pos < len(text):
        msg, pos = decoder.raw_decode(text, pos)
        msgs.append(msg)
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return msgs


def _attrs(node: dict) -> dict:
    return {a["name"]: next(v for k, v in a.items() if k != "name") for a in node.get("attr", [])}


@needs_chakra
def test_chakra_reader_reads_every_file(tmp_path: Path) -> None:
    _result, out = _export(tmp_path, "dp", "alexnet")
    files = sorted(out.glob("alexnet.*.et"))
    assert [f.name for f in files] == [f"alexnet.{r}.et" for r in range(4)]
    groups = json.loads((out / "comm_groups.json").read_text())
    assert groups == {"1": [0, 1, 2, 3]}
    sends, recvs = {}, {}
    for rank, f in enumerate(files):
        meta, *nodes = _jsonize(f, tmp_path)
        assert _attrs(meta)["dtsim.rank"] == str(rank)
        ids = {int(n.get("id", 0)) for n in nodes}
        assert len(ids) == len(nodes)
        types = {n["type"] for n in nodes}
        assert {"COMP_NODE", "COMM_COLL_NODE"} <= types
        starts = {int(n.get("id", 0)): int(n.get("startTimeMicros", 0)) for n in nodes}
        for n in nodes:
            a = _attrs(n)
            for d in n.get("dataDeps", []):
                # a dependency exists, comes earlier and started no later
                assert int(d) in ids and int(d) < int(n.get("id", 0))
                assert starts[int(d)] <= starts[int(n.get("id", 0))]
            if n["type"] == "COMM_COLL_NODE":
                assert a["pg_name"] in groups and int(a["comm_size"]) > 0
                assert n.get("dataDeps"), "a bucket's all-reduce waits for its backward"
            elif n["type"] == "COMM_SEND_NODE":
                sends[(rank, int(a["comm_dst"]), a["comm_tag"])] = a["comm_size"]
            elif n["type"] == "COMM_RECV_NODE":
                recvs[(int(a["comm_src"]), rank, a["comm_tag"])] = a["comm_size"]
        # every measured layer's forward and backward are compute nodes with durations
        passes = [
            _attrs(n)
            for n in nodes
            if n["type"] == "COMP_NODE" and _attrs(n).get("dtsim.iteration") == "1"
        ]
        assert {p["dtsim.pass"] for p in passes} >= {"forward", "backward"}
    assert sends == recvs  # both ends of every message, same peers, tags and bytes
    # The collectives carry the bytes the run all-reduced: buckets times iterations.
    coll_bytes = sum(
        int(_attrs(n)["comm_size"])
        for n in _jsonize(files[0], tmp_path)[1:]
        if n["type"] == "COMM_COLL_NODE"
    )
    assert coll_bytes == 3 * 244403360  # alexnet's gradients, 1 warm-up + 2 iterations


@needs_chakra
def test_p3_forward_waits_for_its_pulled_slices(tmp_path: Path) -> None:
    from traces.chakra import attrs, read

    _result, out = _export(tmp_path, "p3", "resnet18", "--set", "fidelity=analytic")
    worker = read(out / "resnet18.0.et")
    by_id = {n.id: n for n in worker.nodes}
    first = next(
        n
        for n in worker.nodes
        if attrs(n).get("dtsim.pass") == "forward" and attrs(n)["dtsim.iteration"] == 1
    )
    pulled = [by_id[d] for d in first.data_deps if by_id[d].type == pb.COMM_RECV_NODE]
    assert pulled, "the next iteration's first layer waits for its parameters"
    # p3 has no collectives, and the pulls come from the servers (ranks after the 4 workers)
    assert json.loads((out / "comm_groups.json").read_text()) == {}
    assert all(attrs(n)["comm_src"] >= 4 for n in pulled)


@needs_chakra
def test_pipeline_schedule_orders_stage_nodes(tmp_path: Path) -> None:
    from traces.chakra import attrs, read

    _result, out = _export(tmp_path, "gpipe", "alexnet", "--set", "fidelity=analytic")
    stage1 = read(out / "alexnet.1.et")
    by_id = {n.id: n for n in stage1.nodes}
    forwards = [
        n
        for n in stage1.nodes
        if n.type == pb.COMP_NODE and attrs(n).get("dtsim.pass") == "forward"
    ]
    # A later stage's first forward of each micro-batch waits for that micro-batch's
    # activations from the stage before.
    firsts: dict[int, object] = {}
    for n in forwards:
        firsts.setdefault((attrs(n)["dtsim.iteration"], attrs(n)["dtsim.microbatch"]), n)
    for n in firsts.values():
        kinds = {by_id[d].type for d in n.data_deps}
        assert pb.COMM_RECV_NODE in kinds, n.name


@needs_chakra
def test_pytorch_run_recorded_here_imports_to_its_layers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.Tanh()
    )
    x, target = torch.randn(4, 16), torch.randn(4, 8)
    host, device = tmp_path / "et.json", tmp_path / "kineto.json"
    observer = ExecutionTraceObserver()
    observer.register_callback(str(host))
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(device)),
    ) as prof:
        for step in range(2):
            if step == 1:
                observer.start()
            torch.nn.functional.mse_loss(model(x), target).backward()
            if step == 1:
                observer.stop()
            prof.step()
    observer.unregister_callback()
    dest = tmp_path / "net.json"
    r = _run("trace", "convert", str(host), str(dest), "--kineto", str(device))
    assert r.exit_code == 0, r.output
    data = json.loads(dest.read_text())
    assert [layer["op"] for layer in data["layers"]] == [
        "aten::linear",
        "aten::relu",
        "aten::linear",
        "aten::tanh",
    ]
    params = sum(layer["param_bytes"] for layer in data["layers"]) // 4
    assert params == sum(p.numel() for p in model.parameters())
    assert data["meta"]["batch_size"] == 4
    assert all(layer["forward_s"] > 0 and layer["backward_s"] > 0 for layer in data["layers"])
    assert [layer["activation_bytes"] for layer in data["layers"]] == [512, 512, 128, 128]
    again = _run("run", "--model", str(dest), "--gpus", "2", "--scheme", "dp")
    assert again.exit_code == 0, again.output
    # Without its Kineto trace the execution trace has no times: one line saying so.
    _one_line_error(_run("trace", "show", str(host)), str(host), "--kineto")
    # The two files swapped: the first one named is not an execution trace.
    swapped = _run("trace", "convert", str(device), str(tmp_path / "x.json"), "--kineto", str(host))
    _one_line_error(swapped, str(device), "not a PyTorch execution trace")
    assert not (tmp_path / "x.json").exists()


@needs_chakra
@pytest.mark.slow
def test_profile_format_chakra_then_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from realrun import zoo

    out = tmp_path / "mlp.0.et"
    r = _run(
        "profile", "--model", "mlp_small", "--batch-size", "4", "--format", "chakra",
        "--out", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    from traces.chakra import load

    trace = load(out)
    model = zoo.build("mlp_small")
    assert trace.param_count == sum(p.numel() for p in model.parameters())
    assert [layer.name for layer in trace.layers] == [
        "body.0",
        "body.1",
        "body.2",
        "body.3",
        "head",
    ]
    again = _run("run", "--model", str(out), "--gpus", "2", "--scheme", "dp")
    assert again.exit_code == 0, again.output


# ---- bad input --------------------------------------------------------------------------


@needs_chakra
def test_truncated_file_is_named(tmp_path: Path) -> None:
    _result, out = _export(tmp_path, "dp", "alexnet")
    f = out / "alexnet.2.et"
    from traces.chakra import read

    last = read(f).nodes[-1].ByteSize()
    whole = f.read_bytes()
    f.write_bytes(whole[:-7])
    _one_line_error(_run("trace", "show", str(out)), "alexnet.2.et", "truncated")
    # cut between two messages: the node count in the metadata tells
    f.write_bytes(whole[: -(last + 1 + (last >= 128))])
    _one_line_error(_run("trace", "show", str(out)), "alexnet.2.et", "nodes; the file is truncated")


@needs_chakra
@pytest.mark.parametrize("missing", [1, 3])
def test_missing_rank_file_is_named(tmp_path: Path, missing: int) -> None:
    _result, out = _export(tmp_path, "dp", "alexnet")
    (out / f"alexnet.{missing}.et").unlink()
    line = _one_line_error(_run("trace", "show", str(out / "alexnet.0.et")), "missing")
    assert f"alexnet.{missing}.et" in line


@needs_chakra
def test_not_chakra_protobuf_is_named(tmp_path: Path) -> None:
    from google.protobuf import descriptor_pb2

    from traces.chakra import write_messages

    other = descriptor_pb2.FileDescriptorProto(name="x.proto", package="not.chakra")
    bad = tmp_path / "other.0.et"
    write_messages(str(bad), other, [descriptor_pb2.DescriptorProto(name="Thing")])
    _one_line_error(_run("trace", "show", str(bad)), "other.0.et", "not a Chakra")
    text = tmp_path / "text.0.et"
    text.write_text("this is not a protobuf at all\n" * 4)
    _one_line_error(_run("run", "--model", str(text)), "text.0.et", "not a Chakra")


@needs_chakra
def test_et_without_kineto_durations(tmp_path: Path) -> None:
    from traces.chakra import write_messages

    meta = pb.GlobalMetadata(attr=[pb.AttributeProto(name="schema", string_val="1.1.1")])
    nodes = [
        pb.Node(id=1, name="[pytorch|profiler|execution_trace|thread]", type=pb.COMP_NODE),
        pb.Node(id=2, name="aten::linear", type=pb.COMP_NODE, ctrl_deps=[1], data_deps=[1]),
    ]
    f = tmp_path / "host.0.et"
    write_messages(str(f), meta, nodes)
    _one_line_error(
        _run("trace", "convert", str(f), str(tmp_path / "x.json")), "host.0.et", "Kineto"
    )
    assert not (tmp_path / "x.json").exists()


def test_options_say_what_to_install_without_chakra(tmp_path: Path, monkeypatch) -> None:
    # As without the package: its import fails.
    for mod in ("chakra", "chakra.schema", "chakra.schema.protobuf"):
        monkeypatch.setitem(sys.modules, mod, None)
    out = tmp_path / "et"
    r = _run("run", "--gpus", "2", "--chakra-out", str(out))
    _one_line_error(r, "--chakra-out", "pip install")
    assert not out.exists()
    _one_line_error(
        _run(
            "profile", "--model", "mlp_small", "--format", "chakra", "--out", str(tmp_path / "a.et")
        ),
        "pip install",
    )
    f = tmp_path / "some.0.et"
    f.write_bytes(b"\x00")
    _one_line_error(_run("trace", "show", str(f)), "pip install")


def test_chakra_out_must_be_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    _one_line_error(_run("run", "--gpus", "2", "--chakra-out", str(f)), "--chakra-out", "is a file")
    assert os.path.isfile(f)
