"""A Clariden login node as docs/slurm.md and docs/corpora.md prepare it, in a workflow copy (no GPU, no Slurm).

``prepare(w)`` turns a copy of the workflow (``test_bad_input.workflow_copy``) into what a user has after the
set-up steps: the model directories, the container image and the datasets at the paths the copied
``config/clariden-70b.yaml`` names (the shared store ``/capstor/store/cscs/swissai/infra01`` becomes
``<copy>/capstor``), the datasets under ``$SPECSTUDY_DATASETS`` and their sha256 written into the copied
corpus specs in place of the ``FILL-ME`` placeholders. It returns the environment to run with. The datasets
are tiny stand-ins of the right format: dry runs and pre-flights read them, nothing builds a corpus from them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

STORE = "/capstor/store/cscs/swissai/infra01"
CONFIG = "config/clariden-70b.yaml"
#: spec of the copy -> (dataset file under $SPECSTUDY_DATASETS, its bytes)
DATASETS = {
    "corpora/clariden/open_chat.yaml": ("sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json", json.dumps(
        [{"id": "a", "conversations": [{"from": "human", "value": "Hello?"}]}]).encode()),
    "corpora/clariden/code.yaml": ("humaneval/HumanEval.jsonl.gz", gzip.compress(
        b'{"task_id": "HumanEval/0", "prompt": "def f():\\n"}\n', mtime=0)),
    "corpora/clariden/summarization.yaml": ("govreport/test.jsonl", b'{"id": "r1", "report": "A report."}\n'),
}


def prepare(w: Path, *, fill_digests: bool = True, datasets: bool = True) -> dict[str, str]:
    """Make the copy ``w`` a prepared login node; returns the variables to add to the environment
    (``SPECSTUDY_DATASETS``). ``fill_digests=False`` leaves the specs' placeholders; ``datasets=False``
    puts no dataset files."""
    store = w / "capstor"
    cfg = w / CONFIG
    cfg.write_text(cfg.read_text().replace(STORE, str(store)))
    for name in re.findall(re.escape(str(store)) + r"[^\s\",\]]*", cfg.read_text()):
        p = Path(name)
        if p.suffix == ".sqsh":
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"hsqs")  # squashfs magic: a stand-in image
        else:
            p.mkdir(parents=True, exist_ok=True)
            (p / "config.json").write_text("{}")
    root = w / "datasets"
    for spec, (rel, data) in DATASETS.items():
        if datasets:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        if fill_digests:
            spec_file = w / spec
            spec_file.write_text(re.sub(r"sha256: FILL-ME\S*", "sha256: " + hashlib.sha256(data).hexdigest(),
                                        spec_file.read_text()))
    return {"SPECSTUDY_DATASETS": str(root)}
