"""Issue 29 item 3: a summary written by ``cell.run_cell`` carries its digest and attempt, reads back
through ``specstudy tables`` unchanged, and is refused once edited or moved."""

from __future__ import annotations

import json
import shutil

import pytest

from specstudy.analysis import tables
from specstudy.core import atomic
from specstudy.core.integrity import IntegrityError, digest
from specstudy.measure import cell
from test_cell import CORPUS, KEYS, fake_loadgen


def _measured(tmp_path, monkeypatch):
    fake_loadgen(monkeypatch, [])
    cdir = tmp_path / "results/screen/draft-k3-tp1/rep1/chat/c2"
    s = cell.run_cell("http://127.0.0.1:9", "m", [object()] * 4, [], 2, cdir, keys=dict(KEYS), corpus=CORPUS,
                      metrics_url="http://127.0.0.1:9/metrics", fingerprint="a" * 64, drain_timeout_s=0.0,
                      metrics_timeout_s=0.5)
    return cdir / "summary.json", s


def test_a_written_summary_is_sealed_and_reads_back(tmp_path, monkeypatch):
    path, s = _measured(tmp_path, monkeypatch)
    raw = json.loads(path.read_text())
    assert raw["integrity"] == {"sha256": digest(raw), "attempt": KEYS["deployment_id"]}
    rows = tables.collect(tmp_path / "results")["cells"]
    assert [(r["arm"], r["workload"], r["concurrency"]) for r in rows] == [("draft-k3-tp1", "chat", 2)]


def test_an_edited_summary_is_refused(tmp_path, monkeypatch):
    path, _ = _measured(tmp_path, monkeypatch)
    raw = json.loads(path.read_text())
    raw["tokens"]["output_tokens_per_second"] = 1e6
    path.write_text(json.dumps(raw))
    with pytest.raises(atomic.Changed, match="was changed after it was written"):  # its record, first
        tables.collect(tmp_path / "results")
    atomic.sidecar(path).unlink()  # and without the record: the summary's own digest
    with pytest.raises(IntegrityError, match=r"integrity\.sha256.*specstudy rerun"):
        tables.collect(tmp_path / "results")


def test_a_moved_summary_is_refused(tmp_path, monkeypatch):
    path, _ = _measured(tmp_path, monkeypatch)
    other = tmp_path / "results/screen/ngram-k3/rep1/chat/c2"
    other.mkdir(parents=True)
    shutil.move(path, other / "summary.json")
    with pytest.raises(IntegrityError, match=r"keys\.arm is 'draft-k3-tp1', the path says 'ngram-k3'"):
        tables.collect(tmp_path / "results")


def test_an_edit_laundered_by_deleting_the_seal_is_refused(tmp_path, monkeypatch):
    """The deployment job publishes a cell from its attempt copy, which keeps the seal: a published summary
    without one, beside a sealed attempt copy, had its digest deleted (with or without an edit)."""
    path, _ = _measured(tmp_path, monkeypatch)
    out = path.parents[2]
    attempt = out / "attempts" / KEYS["deployment_id"] / "chat" / "c2"
    attempt.mkdir(parents=True)
    shutil.copy(path, attempt / "summary.json")
    tables.collect(tmp_path / "results")  # sealed and intact: read
    raw = json.loads(path.read_text())
    raw.pop("integrity")
    raw["tokens"]["output_tokens_per_second"] = 1e6
    path.write_text(json.dumps(raw))
    atomic.sidecar(path).unlink()  # the record taken off too (with it, the record refuses the edit first)
    with pytest.raises(IntegrityError, match=r"field 'integrity' missing, but its deployment job sealed this cell"):
        tables.collect(tmp_path / "results")
    # an unsealed tree with no sealed attempt copy (written before sealing, or by hand) is still read
    (attempt / "summary.json").unlink()
    assert len(tables.collect(tmp_path / "results")["cells"]) == 1
