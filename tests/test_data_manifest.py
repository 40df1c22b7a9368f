"""The suite stands on its own: the upstream and GPU data the tests read are part of the repository (tests/data,
one folder per data set, each with a MANIFEST.md giving every file's source, bytes and sha256), and no test reads
data from beside the repository (``../shared``), which a clone does not have."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from conftest import ROOT, TEST_DATA, data_path
from specstudy.analysis import upstream

SETS = sorted(p.name for p in TEST_DATA.iterdir() if p.is_dir())
# a manifest row: `local path` first, then (after any source columns) its bytes and `sha256`
ROW = re.compile(r"^\| `([^`]+)` \|(?:.*?\|)? (\d+) \| `([0-9a-f]{64})` \|", re.M)


def test_every_data_set_has_a_manifest():
    assert {"gpu", "upstream-70b", "upstream-8b", "scale-h200"} <= set(SETS)
    assert [s for s in SETS if not (TEST_DATA / s / "MANIFEST.md").is_file()] == []


@pytest.mark.parametrize("name", SETS)
def test_manifest_lists_every_file_with_its_bytes_and_sha256(name):
    root = TEST_DATA / name
    listed = {m[1]: (int(m[2]), m[3]) for m in ROW.finditer((root / "MANIFEST.md").read_text(encoding="utf-8"))}
    present = {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and p.name != "MANIFEST.md"}
    assert set(present) == set(listed), sorted(set(present) ^ set(listed))
    for rel, p in present.items():
        data = p.read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == listed[rel], rel


def test_upstream_70b_manifest_gives_the_importer_a_commit_for_every_file():
    """`specstudy import-upstream` reads the commit and sha256 of each imported file from this table."""
    root = data_path("upstream-70b")
    rows = upstream.read_manifest(root / "MANIFEST.md")
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != "MANIFEST.md"}
    assert set(rows) == present
    assert {r["repo"] for r in rows.values()} == {"swiss-ai/apertus-speculative-decoding"}
    assert all(re.fullmatch(r"[0-9a-f]{40}", r["commit"]) for r in rows.values())


def test_a_missing_data_file_is_an_error_naming_its_manifest():
    with pytest.raises(FileNotFoundError, match=r"tests/data/gpu/MANIFEST\.md.*git checkout -- tests/data/gpu/absent"):
        data_path("gpu", "absent.prom")


# Paths to data beside the repository, as a test module could spell them.
OUTSIDE = re.compile(r"/work/shared|\.\./shared|\"\.\.\"\s*/\s*\"shared\"|\.parent\s*/\s*\"shared\"")


def test_no_test_reads_data_from_beside_the_repository():
    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
                 for p in sorted((ROOT / "tests").rglob("*.py")) if p != Path(__file__)
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]
    assert offenders == []
