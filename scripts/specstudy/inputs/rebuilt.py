"""Models rebuilt for a resumed study must be the models the packed results were measured with.

A study resumed in a new allocation (a second GPU lease, a Clariden job after the first one's time ran
out: issue 27 item 3) carries its ``results/`` without model weights; the models are rebuilt from their
seeds. Before Snakemake may take the packed results as done, every rebuilt file must have the sha256 the
packed model records name: ``fixture/models.json`` (``target``/``draft`` ``weights_sha256``) and, where
the study has a scale model, ``scale/scale.json`` (every file of ``target/`` and ``draft/``). A mismatch
(another torch build, another seed) means the old cells were measured on other weights: the resume is
refused, naming each file. ``specstudy models-verify``; `envs/gpu/lease.sh resume` calls it.
"""

from __future__ import annotations

from pathlib import Path

from specstudy.core import atomic
from specstudy.core.errors import UserError
from specstudy.inputs.scale_model import RECORD_NAME as SCALE_RECORD
from specstudy.inputs.scale_model import ROLES


def expected_files(records: str | Path) -> dict[str, str]:
    """``{path relative to the models directory: sha256}`` from the packed model records under ``records``."""
    records = Path(records)
    fixture = records / "fixture" / "models.json"
    if not fixture.is_file():
        raise UserError(f"{fixture}: no fixture model record in the packed results; they cannot be resumed "
                        "(pack them with `envs/gpu/lease.sh pack`, which keeps the records)")
    want: dict[str, str] = {}
    rec = atomic.read_json(fixture)
    for role in ROLES:
        sha = (rec.get(role) or {}).get("weights_sha256")
        if not sha:
            raise UserError(f"{fixture}: field {role}.weights_sha256 missing; the record is not a fixture-model record")
        want[f"fixture/{role}/model.safetensors"] = sha
    scale = records / "scale" / SCALE_RECORD
    if scale.is_file():
        srec = atomic.read_json(scale)
        for role in ROLES:
            files = (srec.get(role) or {}).get("files")
            if not isinstance(files, dict) or not files:
                raise UserError(f"{scale}: field {role}.files missing; the record is not a scale-model record")
            for name, sha in files.items():
                want[f"scale/{role}/{name}"] = sha
    return want


def mismatches(records: str | Path, models: str | Path, want: dict[str, str] | None = None) -> list[str]:
    """One line per rebuilt file under ``models`` that is missing or differs from the packed records
    (``want``: their :func:`expected_files`, when the caller has read them already)."""
    models = Path(models)
    bad = []
    for rel, sha in sorted((want if want is not None else expected_files(records)).items()):
        path = models / rel
        if not path.is_file():
            bad.append(f"{path}: missing (the packed results were measured with sha256 {sha[:12]}…)")
            continue
        got = atomic.sha256_file(path)
        if got != sha:
            bad.append(f"{path}: sha256 {got[:12]}… but the packed results were measured with {sha[:12]}…")
    return bad


def _cmd_verify(args) -> int:
    want = expected_files(args.records)
    bad, n = mismatches(args.records, args.models, want), len(want)
    if bad:
        print(f"models-verify: {len(bad)} of {n} rebuilt model files are not the ones the packed results were "
              f"measured with ({args.records}):")
        for line in bad:
            print(f"  {line}")
        print("fix: rebuild with the seeds and torch build of the first run (same image), or start the study afresh "
              "instead of resuming it")
        return 1
    print(f"models-verify: {n} rebuilt model files have the sha256 of the packed records ({args.records})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("models-verify", help="check that rebuilt models are the ones packed results were measured "
                       "with (resuming a study in a new allocation)")
    p.add_argument("--records", required=True, help="the packed results' models directory (fixture/models.json, "
                   "scale/scale.json)")
    p.add_argument("--models", required=True, help="the rebuilt models directory (fixture/, scale/)")
    p.set_defaults(func=_cmd_verify)
