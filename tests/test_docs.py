"""The design documentation lives in the repository and covers every scheme."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from simcore.schemes import scheme_names

ROOT = Path(__file__).resolve().parent.parent


def test_every_scheme_has_a_section_in_docs_schemes_md():
    text = (ROOT / "docs" / "schemes.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^## \d+\. ([\w-]+):", text, flags=re.M))
    assert set(scheme_names()) <= headings


def test_nothing_refers_to_design_files_outside_the_repository():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    outside = re.compile(r"\bSCHEMES\.md|\bARCHITECTURE\.md|\.\./shared/|/work/shared")
    hits = [
        f
        for f in files
        if f.endswith((".py", ".md", ".toml", ".yaml", ".txt"))
        and f != "tests/test_docs.py"
        and outside.search((ROOT / f).read_text(encoding="utf-8", errors="replace"))
    ]
    assert not hits, hits


def test_the_readme_is_short_and_every_file_it_links_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 500
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links its docs"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing


def test_docs_link_only_to_files_that_exist():
    missing = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text("utf-8")):
            if not (page.parent / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, missing
