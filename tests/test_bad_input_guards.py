"""Bad input on a study in progress: its own block of rows in docs/bad-input.md, each produced by running it.

Every row builds its input in a temporary directory, runs one ``specstudy`` command or a Snakemake dry run of
a workflow copy, and must be ``clear`` (tests/test_bad_input.py: non-zero exit, no traceback, every expected
fragment) or, for a row marked ``valid``, succeed showing what it did. The row in the documentation (command,
exit code, message) must be the one the run produces: ``python tests/test_bad_input_guards.py --write``
runs every row and rewrites the block between the ``guards-table`` markers.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from test_bad_input import ROOT, SNAKEMAKE, SPECSTUDY, _env, _small_config, _write_yaml, classify, workflow_copy
from test_bad_input_table import Row, _cell_summary, _json_file, put, sm, sm_cfg

sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.core import atomic  # noqa: E402

DOC = ROOT / "docs/bad-input.md"
START, END = "<!-- guards-table:start -->", "<!-- guards-table:end -->"
HEADER = "| case | command | exit | message |\n|---|---|---|---|"
CELL = "results/screen/baseline/rep1/code/c1/summary.json"


# ------------------------------------------------------------------ builders

def _recorded_tree(w: Path) -> None:
    """What a study in progress holds: a plan written by `specstudy plan`, a cell summary written (and recorded)
    the way the deployment job writes it."""
    subprocess.run([*SPECSTUDY, "plan", "--config", str(w / "tests/data/study-small.yaml"), "--phase", "screen",
                    "--out", str(w / "results/plan/screen.json")], check=True, env=_env(), cwd=w, capture_output=True)
    atomic.write_json(w / CELL, _cell_summary())


def _edit_plan(w: Path) -> None:
    p = w / "results/plan/screen.json"
    plan = json.loads(p.read_text())
    plan["deployments"] = plan["deployments"][:1]  # a hand edit: one deployment fewer
    p.write_text(json.dumps(plan, indent=2))


def _truncate_cell(w: Path) -> None:
    p = w / CELL
    p.write_bytes(p.read_bytes()[:200])


def sm_tree(tamper) -> Callable[[Path], list[str]]:
    """A dry run of a workflow copy holding a recorded results tree after ``tamper``."""
    def mutate(w: Path) -> list[str]:
        _recorded_tree(w)
        tamper(w)
        return []
    return sm(mutate)


def check_results(tamper, *extra: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        w = workflow_copy(d)
        _recorded_tree(w)
        tamper(w)
        return [*SPECSTUDY, "check-results", "--directory", str(w), *extra]
    return setup


def _resealed_edit(d: Path) -> list[str]:
    """A recorded summary edited by hand, its own digest re-computed (the seal alone cannot tell)."""
    from specstudy.core.integrity import digest

    p = atomic.write_json(d / "results" / CELL.removeprefix("results/"), _cell_summary())
    s = json.loads(p.read_text())
    s["latency_ms"]["tpot"]["p50"] = 5.0
    s["integrity"]["sha256"] = digest(s)
    p.write_text(json.dumps(s, indent=1))
    return [*SPECSTUDY, "tables", "--cells", str(p), "--out", str(d / "tables")]


def _files(d: Path) -> dict[str, Path]:
    """A study config, its screening plan, a cell summary, an empty file and a directory."""
    cfg = _write_yaml(d / "study.yaml", _small_config(d))
    plan = d / "plan.json"
    subprocess.run([*SPECSTUDY, "plan", "--config", str(cfg), "--phase", "screen", "--out", str(plan)], check=True,
                   env=_env(), cwd=d, capture_output=True)
    cell = _json_file(d / CELL, _cell_summary())
    empty = d / "empty.txt"
    empty.write_text("")
    (d / "adir").mkdir(exist_ok=True)
    return {"cfg": cfg, "plan": plan, "cell": cell, "empty": empty, "dir": d / "adir"}


def cli(build) -> Callable[[Path], list[str]]:
    """``specstudy <build(files, d)>`` on the files of :func:`_files`."""
    def setup(d: Path) -> list[str]:
        return [*SPECSTUDY, *map(str, build(_files(d), d))]
    return setup


def _rerun_no_plan(path: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        cfg = _write_yaml(d / "study.yaml", _small_config(d))
        return [*SPECSTUDY, "rerun", "-n", "--profile", "", "--configfile", str(cfg), path]
    return setup


def _drop_summarization(w: Path) -> list[str]:
    """The embedded study after its config dropped a workload its pre-registration's hypothesis H2 names."""
    cfg = yaml.safe_load((w / "config/config.yaml").read_text())
    del cfg["corpora"]["workloads"]["summarization"]
    (cfg.get("cost") or {}).get("seconds_per_request", {}).pop("summarization", None)  # its cost figure goes too
    return ["--configfile", str(_write_yaml(w / "bad.yaml", cfg))]


GUARD_ROWS: list[Row] = [
    # ------------------------------------------------------------ results files recorded when written
    Row("sm-results-plan-hand-edited", "results tampering", sm_tree(_edit_plan),
        ["results/plan/screen.json", "changed after specstudy wrote them", "nothing was run",
         "specstudy check-results --repair"]),
    Row("sm-results-summary-truncated", "results tampering", sm_tree(_truncate_cell),
        [CELL, "changed after specstudy wrote them", "specstudy check-results --repair"]),
    Row("check-results-plan-hand-edited", "results tampering", check_results(_edit_plan),
        ["NOT OK recorded files: results/plan/screen.json", "snakemake --profile profiles/local results/plan/screen.json",
         "repair: specstudy check-results --repair"]),
    Row("check-results-repair-moves-aside", "results tampering", check_results(_edit_plan, "--repair"),
        ["moved results/plan/screen.json aside to screen.json.changed-",
         "write it again with `snakemake --profile profiles/local results/plan/screen.json`",
         "consistent: nothing to repair"],
        valid="--repair moves the edited plan aside and names its rule; the tree is then consistent"),
    Row("tables-summary-edited-and-resealed", "results tampering", _resealed_edit,
        ["summary.json", "was changed after it was written", "specstudy check-results --repair"]),
    # ------------------------------------------------------------ the pre-registration against its study
    Row("sm-prereg-hypothesis-workload-gone", "pre-registration", sm(_drop_summarization),
        ["config/preregistration.yaml", "hypotheses[1]' (H2).roles.high", "'summarization' is not a workload of this study",
         "corpora.workloads"]),
    Row("sm-prereg-mixture-workload-gone", "pre-registration",
        sm_cfg(put("corpora.workloads", {"summarization": "corpora/embedded/summarization.yaml"})),
        ["preregistration-small.yaml", "traffic.mixture", "'code' not a workload of the study"]),
    # ------------------------------------------------------------ a specstudy tool given the wrong kind of file
    Row("telemetry-summary-empty", "CLI", cli(lambda f, d: ["telemetry-summary", f["empty"]]),
        ["empty.txt", "empty", "telemetry.jsonl"]),
    Row("telemetry-summary-a-summary", "CLI", cli(lambda f, d: ["telemetry-summary", f["plan"]]),
        ["plan.json", "a JSON document, not JSON lines", "telemetry.jsonl"]),
    Row("deploy-confounds-a-record", "CLI", cli(lambda f, d: ["deploy-confounds", f["plan"]]),
        ["plan.json", "not a launch log", "launch.log"]),
    Row("deploy-confounds-empty", "CLI", cli(lambda f, d: ["deploy-confounds", f["empty"]]),
        ["empty.txt", "empty file", "launch.log"]),
    Row("confirm-show-a-plan", "CLI", cli(lambda f, d: ["confirm-show", f["plan"]]),
        ["plan.json", "'specstudy.plan/1'", "not a confirmation checkpoint", "round<n>.json"]),
    Row("tables-results-without-cells", "CLI", cli(lambda f, d: ["tables", "--results", f["dir"], "--out", d / "t"]),
        ["adir", "no cell summary", "--results"]),
    Row("tables-cells-none", "CLI", cli(lambda f, d: ["tables", "--cells", "--out", d / "t"]),
        ["--cells names no cell summary", "summary.json"]),
    Row("plan-arms-from-a-summary", "CLI", cli(lambda f, d: [
        "plan", "--config", f["cfg"], "--phase", "sampling", "--arms-from", f["cell"], "--out", d / "p.json"]),
        ["summary.json", "--arms-from", "not a plan", "results/plan/confirm.json"]),
    Row("plan-corpora-a-plan", "CLI", cli(lambda f, d: [
        "plan", "--config", f["cfg"], "--phase", "screen", "--corpora", f["plan"], "--out", d / "p.json"]),
        ["plan.json", "--corpora", "not a corpus record", "specstudy.plan/1", "corpus build"]),
    Row("select-lock-a-summary", "CLI", cli(lambda f, d: [
        "select", "--config", f["cfg"], "--lock", f["cell"], "--summaries", f["cell"], "--out", d / "sel.json"]),
        ["summary.json", "not a pre-registration lock", "results/screen/prereg-lock.json"]),
    Row("confirm-round-lock-a-summary", "CLI", cli(lambda f, d: [
        "confirm-round", "--config", f["cfg"], "--lock", f["cell"], "--plan", f["plan"], "--round", "1",
        "--summaries", f["cell"], "--out", d / "r.json"]),
        ["summary.json", "not a pre-registration lock", "prereg-lock"]),
    Row("corpus-check-a-file", "CLI", cli(lambda f, d: ["corpus", "check", "--corpus", f["plan"], "--digest", "x"]),
        ["plan.json", "not a corpus directory", "results/corpora/<name>/<version>/"]),
    # ------------------------------------------------------------ Snakemake's own mistakes
    Row("sm-profile-misspelt", "environment", sm(lambda w: ["--profile", "profiles/lokal"]),
        ["profiles/lokal", "no profile.yaml (or config.yaml) found"]),
    # ------------------------------------------------------------ a re-run before its phase is planned
    Row("rerun-arm-not-in-study", "CLI", _rerun_no_plan("results/screen/draft-k3-tp4/rep1/code/c8/summary.json"),
        ["draft-k3-tp4", "not an arm of this study", "study.yaml", "baseline, ngram-k2"]),
    Row("rerun-workload-not-in-study", "CLI", _rerun_no_plan("results/screen/baseline/rep1/chat/c1/summary.json"),
        ["'chat' is not a workload of this study", "corpora.workloads: code"]),
]


# ------------------------------------------------------------------ the documented rows

def _normal(text: str, d: Path) -> str:
    text = text.replace(str(d), "<tmp>").replace(str(ROOT), "<repo>").replace(sys.executable, "python")
    text = re.sub(r"\b[0-9a-f]{12,64}\b", "<sha>", text)
    return text


def doc_row(row: Row, cmd: list[str], rc: int, out: str, d: Path) -> str:
    """The row of the documentation: the command as a user types it, the exit code, the lines that say what
    is wrong (those holding an expected fragment)."""
    words = [str(c) for c in cmd]
    for prefix, short in ((SPECSTUDY, ["specstudy"]), (SNAKEMAKE, ["snakemake"])):
        if words[:len(prefix)] == [str(p) for p in prefix]:
            words = short + words[len(prefix):]
    command = _normal(shlex.join(words), d)
    low = [e.lower() for e in row.expect]
    lines = [ln.strip() for ln in out.splitlines() if any(e in ln.lower() for e in low)]
    message = _normal(" ⏎ ".join(dict.fromkeys(lines)), d)
    if len(message) > 600:
        message = message[:600] + " …"
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    return f"| {row.id} | `{esc(command)}` | {rc} | {esc(message)} |"


def documented() -> dict[str, str]:
    text = DOC.read_text()
    block = text[text.index(START) + len(START):text.index(END)]
    return {m.group(1): line for line in block.splitlines() if (m := re.match(r"\| ([\w-]+) \|", line))
            and m.group(1) != "case"}


@pytest.mark.parametrize("row", GUARD_ROWS, ids=[r.id for r in GUARD_ROWS])
def test_guard_row(row: Row, tmp_path: Path):
    cmd, rc, out = _run_keep_cmd(row, tmp_path)
    want = "valid" if row.valid else "clear"
    verdict = _verdict(row, rc, out)
    assert verdict == want, f"{row.id}: {verdict} (rc {rc}); expected {row.expect} in:\n{out[-3000:]}"
    assert documented().get(row.id) == doc_row(row, cmd, rc, out, tmp_path), (
        f"{row.id}: docs/bad-input.md's row is not what the command prints now; "
        "run `python tests/test_bad_input_guards.py --write`")


def test_every_documented_guard_row_is_tested():
    assert sorted(documented()) == sorted(r.id for r in GUARD_ROWS)
    assert len({r.id for r in GUARD_ROWS}) == len(GUARD_ROWS)


def _run_keep_cmd(row: Row, d: Path) -> tuple[list[str], int, str]:
    cmd = row.setup(d)
    proc = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=240, env=_env())
    return cmd, proc.returncode, proc.stdout + proc.stderr


def _verdict(row: Row, rc: int, out: str) -> str:
    if row.valid:
        low = out.lower()
        return "valid" if rc == 0 and all(e.lower() in low for e in row.expect) else "refused-valid"
    # Snakemake's own one-line errors start with a bare "Error: " (no exception name, no traceback)
    return classify(rc, re.sub(r"(?m)^Error: ", "Snakemake error: ", out), row.expect)


if __name__ == "__main__":
    import tempfile

    rows = []
    for row in GUARD_ROWS:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            cmd, rc, out = _run_keep_cmd(row, d)
            verdict = _verdict(row, rc, out)
            rows.append(doc_row(row, cmd, rc, out, d))
        print(f"{verdict:<13} rc={rc:<4} {row.id}", flush=True)
    if "--write" in sys.argv:
        text = DOC.read_text()
        block = f"{START}\n{HEADER}\n" + "\n".join(rows) + f"\n{END}"
        DOC.write_text(text[:text.index(START)] + block + text[text.index(END) + len(END):])
        print(f"wrote {len(rows)} rows to {DOC}")
