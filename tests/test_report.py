"""``sim report``: covers the schemes that exist, names what is missing, resumes."""

from __future__ import annotations

import re

import matplotlib
import pytest

matplotlib.use("Agg")

from analysis.report import build_report, md_table, partition_section, sections
from analysis.store import read_table
from dtsim.cli import main
from simcore.schemes import ORDER, registry

PNG = b"\x89PNG\r\n\x1a\n"


def figures_of(md: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)


def test_quick_report_covers_what_exists_and_names_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as ex:
        main(["report", "--quick", "--out", str(tmp_path), "-j", "1", "--no-progress"])
    out, err = capsys.readouterr()
    assert ex.value.code == 0, err
    assert out.startswith(f"wrote {tmp_path / 'report.md'} (")
    md = (tmp_path / "report.md").read_text()
    reg = registry()

    # every scheme that exists is in the overview, with the numbers of its data file
    overview = read_table(str(tmp_path / "data" / "all-schemes.csv"))
    assert list(overview["scheme"]) == list(reg)
    for _, row in overview.iterrows():
        assert f"| {row['scheme']} | {row['throughput_samples_s']:,.1f} |" in md

    # every scheme of the papers that does not exist is named as missing
    absent = [s for s in ORDER if s not in reg]
    if absent:
        assert f"not yet: {', '.join(absent)}." in md
    for sec in sections():
        lacking = [s for s in sec.schemes if s not in reg]
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| {sec.title} |"))
        assert line.endswith(f"missing: {', '.join(lacking)} |" if lacking else "complete |")
        if lacking:
            assert f"in {sec.title} (missing {', '.join(lacking)})" in out.replace(
                "incomplete: ", "in "
            )
    assert "| The antichain partitioner's balance | complete |" in md

    # the figures it references exist and are real PNGs
    figs = figures_of(md)
    assert len(figs) >= 4
    for f in figs:
        data = (tmp_path / f).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000

    # a rerun finds every point in data/ and simulates nothing
    again = build_report(str(tmp_path), quick=True, jobs=1)
    assert again.computed == 0
    assert (tmp_path / "report.md").read_text() == md


def test_a_section_lights_up_when_its_scheme_exists(tmp_path, monkeypatch):
    """The P3 section compares p3 with ps when p3 exists, and says p3 is missing (while
    still showing ps) in a build without it."""
    from analysis.report import run_section

    sec = next(s for s in sections() if s.key == "p3-vs-ps")
    text, missing, computed = run_section(sec, str(tmp_path / "with"), True, 1, False)
    assert missing == "" and computed == 4
    assert "| ps (samples/s) | p3 (samples/s) | P3 gain |" in text
    assert "Not yet" not in text

    without = {n: c for n, c in registry().items() if n != "p3"}
    monkeypatch.setattr("simcore.schemes.registry", lambda: without)
    text, missing, computed = run_section(sec, str(tmp_path / "without"), True, 1, False)
    assert missing == "p3" and computed == 2
    assert "**Not yet in this build:** p3" in text


def test_partition_section_reports_the_antichain_balance(tmp_path):
    from simcore.partition import partition
    from traces import load_builtin

    md = partition_section(str(tmp_path), quick=True)
    for model in ("vgg16", "resnet18"):
        for gpus in (4, 8):
            part = partition(load_builtin(model), gpus, 1.25e9)
            assert f"| {model} | {gpus} | {len(part.stages)} |" in md
            assert f"{1e3 * part.bottleneck_s:.2f}" in md
    assert "| 0.01 |" in md  # the paper's VGG-16 time on 4 GPUs
    assert (tmp_path / "figures" / "partitioner-balance.png").read_bytes().startswith(PNG)


def test_md_table_aligns_numbers_right():
    t = md_table(("a", "b"), [("x", "1,234.5"), ("y", "-")])
    assert t.splitlines()[1] == "|---|---:|"
