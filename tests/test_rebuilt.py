"""specstudy.inputs.rebuilt: rebuilt models against a resumed study's packed records (issue 27 item 3)."""

from __future__ import annotations

import hashlib
import json

import pytest

from specstudy.core.errors import UserError
from specstudy.inputs import rebuilt


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _records(root, scale_files=None):
    (root / "fixture").mkdir(parents=True)
    (root / "fixture" / "models.json").write_text(json.dumps(
        {"target": {"weights_sha256": _sha(b"t")}, "draft": {"weights_sha256": _sha(b"d")}}))
    if scale_files is not None:
        (root / "scale").mkdir()
        (root / "scale" / "scale.json").write_text(json.dumps(
            {role: {"files": {name: _sha(data) for name, data in files.items()}} for role, files in scale_files.items()}))


def _models(root, files):
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def test_every_file_of_the_fixture_and_scale_records_is_checked(tmp_path):
    _records(tmp_path / "packed", {"target": {"model.safetensors": b"T", "config.json": b"{}"},
                                   "draft": {"model.safetensors": b"D"}})
    files = {"fixture/target/model.safetensors": b"t", "fixture/draft/model.safetensors": b"d",
             "scale/target/model.safetensors": b"T", "scale/target/config.json": b"{}",
             "scale/draft/model.safetensors": b"D"}
    _models(tmp_path / "built", files)
    assert sorted(rebuilt.expected_files(tmp_path / "packed")) == sorted(files)
    assert rebuilt.mismatches(tmp_path / "packed", tmp_path / "built") == []
    (tmp_path / "built" / "scale" / "target" / "config.json").write_bytes(b'{"other": 1}')
    (tmp_path / "built" / "scale" / "draft" / "model.safetensors").unlink()
    bad = rebuilt.mismatches(tmp_path / "packed", tmp_path / "built")
    assert len(bad) == 2
    assert bad[0].startswith(str(tmp_path / "built" / "scale" / "draft" / "model.safetensors") + ": missing")
    assert bad[1].startswith(str(tmp_path / "built" / "scale" / "target" / "config.json") + ": sha256 ")


def test_packed_results_without_a_fixture_record_cannot_be_resumed(tmp_path):
    with pytest.raises(UserError, match=r"fixture/models.json: no fixture model record"):
        rebuilt.expected_files(tmp_path)
    _records(tmp_path)
    (tmp_path / "fixture" / "models.json").write_text('{"target": {}}')
    with pytest.raises(UserError, match=r"field target.weights_sha256 missing"):
        rebuilt.expected_files(tmp_path)


def test_the_command_exits_1_naming_the_files_and_the_fix(tmp_path, capsys):
    from specstudy.cli import main

    _records(tmp_path / "packed")
    _models(tmp_path / "built", {"fixture/target/model.safetensors": b"t", "fixture/draft/model.safetensors": b"x"})
    assert main(["models-verify", "--records", str(tmp_path / "packed"), "--models", str(tmp_path / "built")]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 rebuilt model files" in out and "fixture/draft/model.safetensors: sha256" in out
    assert "fix: rebuild with the seeds and torch build of the first run" in out
