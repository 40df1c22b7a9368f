"""Every command the docs give is a command that works: README.md and docs/*.md (as tests/test_docs.py reads
them: fenced blocks, indented command lines, code spans), each ``snakemake …``, ``specstudy …`` and ``make …``
command line, parsed as the shell and the program would parse it, never from the prose around it.

* ``snakemake``: its arguments go through Snakemake's own parser (``snakemake.cli.parse_args``, profiles and
  their YTE included) in a copy of the workflow; a word the command names as a target (a rule, a path under
  ``results/``, a ``<path>``-like placeholder) that a list-valued option swallows instead (``--forcerun``,
  ``--configfile``, ``--until`` take every following word) is a failure naming the option and what runs instead.
  Then every runnable command (no placeholder, not ``--report``/``--lint``/…) is dry-run (``-n``): one dry run
  per distinct study config with the targets of all its commands, under the first command's profile and
  environment (the Clariden profile included: a dry run needs no Slurm), on a prepared login node
  (tests/clariden_login.py), and each target must be in the jobs it plans (its rule, or a job whose outputs
  hold the path); no target means ``all``.
* ``specstudy``: a complete command is parsed by the CLI's own parser; one with placeholders must name a
  subcommand path whose ``--help`` works.
* ``make``: the target is a rule of the Makefile and every ``VAR=`` it sets is read there.

Commands the docs show as the wrong form on purpose are listed in :data:`COUNTER_EXAMPLES`; each must still
fail these checks (a listed one that passes is a failure too).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import clariden_login
from test_bad_input import SNAKEMAKE, _env, workflow_copy
from test_docs import _SPAN, ROOT, code_pieces, doc_files

#: commands the docs give as the form NOT to use (the text says why); each must fail the checks below
COUNTER_EXAMPLES = {
    "snakemake … --forcerun <path>",            # README, docs/slurm.md: --forcerun swallows the path, runs `all`
    "snakemake --configfile study.yaml report",  # README: --configfile swallows the target
    "snakemake scren",                           # docs/bad-input.md: a misspelt target and the message it gets
    # docs/bad-input.md: a misspelt profile name and Snakemake's own one-line refusal
    "snakemake -d <tmp>/wf -s <tmp>/wf/Snakefile -n screen --profile profiles/lokal",
}
RUNNERS = ("snakemake", "specstudy", "make")
#: Snakemake options after which nothing runs: the command is checked by the parser only
NOT_A_RUN = ("report", "lint", "list_target_rules", "list_rules", "dag", "rulegraph", "filegraph", "summary",
             "detailed_summary", "archive", "unlock", "cleanup_metadata", "delete_all_output", "delete_temp_output",
             "containerize", "generate_unit_tests", "print_compilation", "list_changes", "list_code_changes",
             "list_input_changes", "list_params_changes", "list_untracked", "export_cwl", "d3dag")


@dataclass(frozen=True)
class Command:
    where: str                      # file:line
    text: str                       # the command as written (environment assignments included)
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]           # the program's arguments (runner first)

    @property
    def runner(self) -> str:
        return self.argv[0]

    @property
    def pattern(self) -> bool:
        """Elided arguments (``…``): a shape, not a command to run."""
        return any("…" in a or a == "..." for a in self.argv)

    #: True when the command is a line of a fenced or indented block (one to copy), False in running text
    block: bool = True

    def placeholders(self) -> list[str]:
        """Words that stand for a value: ``<…>``, ``{…}``, ``$VAR``, ``[optional]`` and upper-case metavars."""
        return [a for a in self.argv if re.search(r"[<>\[\]]|\{[^}]*\}", a) or a.startswith("$")
                or re.fullmatch(r"[A-Z][A-Z0-9_]*", a)]


_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_IN_BIN = re.compile(r"[\w./-]*/bin/(?:snakemake|specstudy|make)")


def commands_in(text: str, name: str) -> list[Command]:
    out = []
    spans = {m.group(1).replace("\n", " ") for m in _SPAN.finditer(text)}
    for n, code in code_pieces(text):
        code = re.split(r"(?:^|\s)#", code, maxsplit=1)[0]
        for seg in re.split(r"\s*(?:&&|\|\||;|\||\$\(|\))\s*", code):
            try:
                words = shlex.split(seg)
            except ValueError:  # an unbalanced quote: prose, not a shell line
                continue
            env = []
            while words and _ASSIGN.fullmatch(words[0]):
                env.append(_ASSIGN.fullmatch(words[0]).groups())
                words = words[1:]
            if words[:3] in (["python", "-m", "snakemake"], ["python3", "-m", "snakemake"]):
                words = ["snakemake", *words[3:]]
            if words[:3] in (["python", "-m", "specstudy.cli"], ["python3", "-m", "specstudy.cli"]):
                words = ["specstudy", *words[3:]]
            if len(words) < 2 or not (words[0] in RUNNERS or _IN_BIN.fullmatch(words[0])):
                continue  # a program's name alone is not a command line
            if len(words) > 1 and (words[1] == "=" or words[1].startswith(("=", "(", ".", ":"))):
                continue  # Python, not a shell command (snakemake = ..., make(...))
            out.append(Command(f"{name}:{n}", " ".join([*(f"{k}={v}" for k, v in env), *words]), tuple(env),
                               (Path(words[0]).name, *words[1:]), block=code not in spans))
    return out


@cache
def doc_commands() -> tuple[Command, ...]:
    return tuple(c for p in doc_files()
                 for c in commands_in(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix()))


# ------------------------------------------------------------------------------------------ the workflow copy
@pytest.fixture(scope="module")
def login(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A copy of the workflow on a prepared Clariden login node, and its environment."""
    w = workflow_copy(tmp_path_factory.mktemp("docs"))
    return w, dict(_env(), **clariden_login.prepare(w))


@cache
def rule_names() -> frozenset[str]:
    """Every rule and checkpoint name of the workflow, as the Snakefile and rules/*.smk spell them, and the
    extension phases' generated targets."""
    from specstudy.study import phase_decl

    names = set()
    for f in [ROOT / "Snakefile", *(ROOT / "rules").glob("*.smk")]:
        names.update(re.findall(r"^(?:rule|checkpoint)\s+(\w+)\s*:", f.read_text(), re.M))
    for d in phase_decl.DECLS.values():
        names.update({d.target, f"{d.name}_summary"})
    return frozenset(names)


def _named_target(word: str) -> bool:
    if word.startswith("-"):
        return False
    if word in rule_names() or word.startswith("results/"):
        return True
    return bool(re.fullmatch(r"<[^>]*(?:target|path|cell|result|summary)[^>]*>(?:/[\w./]*)?", word))


@contextlib.contextmanager
def _in(w: Path, env: dict[str, str]):
    old_cwd, old_env = os.getcwd(), dict(os.environ)
    os.chdir(w)
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            yield err
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)


def parse_snakemake(cmd: Command, w: Path, env: dict[str, str]):
    """(parser, args, problems) of a snakemake command as Snakemake itself reads it in the copy ``w``."""
    import snakemake.cli

    with _in(w, {**env, **dict(cmd.env)}) as err:
        try:
            parser, args = snakemake.cli.parse_args(list(cmd.argv[1:]))
        except SystemExit as exc:
            if exc.code in (0, None):
                return None, None, []  # --version, --help: informational
            return None, None, [f"Snakemake refuses its arguments: {err.getvalue().strip().splitlines()[-1:]}"]
    problems = []
    targets = list(args.targets or [])
    words = list(cmd.argv[1:])
    for i, word in enumerate(words):
        if not _named_target(word) or word in targets:
            continue
        opt = next((w_ for w_ in reversed(words[:i]) if w_.startswith("-")), None)
        action = parser._option_string_actions.get(opt.split("=")[0]) if opt and "=" not in opt else None
        if action is not None and action.nargs in ("*", "+", argparse.REMAINDER):
            problems.append(f"the target {word} is swallowed by {opt} (it takes every following word): Snakemake "
                            f"runs {targets or 'the default target all'} instead; put the targets first, or write "
                            f"{opt}=<value>, or use `specstudy rerun <path>`")
    for t in targets:
        if re.fullmatch(r"[A-Za-z_]\w*", t) and t not in rule_names():
            problems.append(f"the target {t} is no rule of the workflow (rules/*.smk, Snakefile)")
    return parser, args, problems


def _run_mode(args) -> bool:
    return not any(getattr(args, a, None) for a in NOT_A_RUN)


def _configs(args) -> tuple[str, ...]:
    return tuple(str(c) for c in (args.configfile or [])) or ("config/config.yaml",)


@dataclass
class DryRun:
    rc: int
    out: str

    def jobs(self) -> list[tuple[str, list[str]]]:
        """(rule, outputs) of every job the dry run plans."""
        found = []
        for m in re.finditer(r"^(?:local)?(?:rule|checkpoint) (\w+):\n((?:    .*\n?)*)", self.out, re.M):
            outputs = re.search(r"^    output: (.*)$", m.group(2), re.M)
            found.append((m.group(1), outputs.group(1).split(", ") if outputs else []))
        return found

    def runs(self, target: str) -> bool:
        return any(rule == target or target in outputs for rule, outputs in self.jobs())


_DRY: dict[tuple, DryRun] = {}


def dry_runs(w: Path, env: dict[str, str], runs: list[tuple]) -> list[DryRun]:
    """Each ``(profile, configs, targets, cmd_env)`` dry-run once (cached), the new ones side by side."""
    procs = {}
    for key in dict.fromkeys(runs):
        if key in _DRY:
            continue
        profile, configs, targets, cmd_env = key
        argv = [*SNAKEMAKE, "-n", *targets, *(["--profile", profile] if profile else [])]
        argv += [f"--configfile={c}" for c in configs if c != "config/config.yaml" or profile is None]
        procs[key] = subprocess.Popen(argv, cwd=w, env={**env, **dict(cmd_env)}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
    for key, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        _DRY[key] = DryRun(proc.returncode, out)
    return [_DRY[k] for k in runs]


def _profile(cmd: Command) -> str | None:
    words = list(cmd.argv)
    for i, word in enumerate(words):
        if word == "--profile" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--profile="):
            return word.split("=", 1)[1]
    return None


def snakemake_problems(commands: list[Command], w: Path, env: dict[str, str]) -> dict[Command, list[str]]:
    """Every problem of each snakemake command: its parse, then one dry run per distinct config."""
    found: dict[Command, list[str]] = {}
    groups: dict[tuple[str, ...], list[tuple[Command, list[str]]]] = {}
    for cmd in commands:
        _parser, args, problems = parse_snakemake(cmd, w, env)
        found[cmd] = problems
        if args is None or problems or cmd.pattern or cmd.placeholders() or not _run_mode(args):
            continue
        groups.setdefault(_configs(args), []).append((cmd, list(args.targets or []) or ["all"]))
    keys = {configs: (_profile(members[0][0]), configs, tuple(dict.fromkeys(t for _, ts in members for t in ts)),
                      members[0][0].env) for configs, members in groups.items()}
    together = dict(zip(keys, dry_runs(w, env, list(keys.values())), strict=True))
    # a group whose dry run fails is run again target by target, to name the one that fails
    alone = [(p, c, (t,), e) for configs, (p, c, ts, e) in keys.items() if together[configs].rc for t in ts]
    single = dict(zip(alone, dry_runs(w, env, alone), strict=True))
    for configs, members in groups.items():
        profile, _c, _t, cmd_env = keys[configs]
        for cmd, ts in members:
            for t in ts:
                run = together[configs] if together[configs].rc == 0 else single[(profile, configs, (t,), cmd_env)]
                if run.rc != 0:
                    tail = [ln for ln in run.out.strip().splitlines() if ln.strip()][-6:]
                    found[cmd].append(f"the dry run of {t} ({', '.join(configs)}) fails:\n      " + "\n      ".join(tail))
                elif not run.runs(t):
                    found[cmd].append(f"the dry run plans no job for {t}: {sorted({r for r, _ in run.jobs()})}")
    return found


# ------------------------------------------------------------------------------------------ specstudy, make
def specstudy_problems(cmd: Command) -> list[str]:
    """A command line of a block without placeholders is parsed whole; any other (a shape, or a subcommand named
    in running text) must name a subcommand path whose ``--help`` works (its options: tests/test_docs.py)."""
    from specstudy import cli

    parser = cli.build_parser()
    words = list(cmd.argv[1:])
    if cmd.pattern or cmd.placeholders() or not cmd.block:
        words = [w_ for w_ in words if not w_.startswith(("-", "[", "<"))]
        path: list[str] = []
        p = parser
        while words:
            subs = next((a.choices for a in p._actions if a.nargs == argparse.PARSER), None)
            if not subs or words[0] not in subs:
                break
            path.append(words.pop(0))
            p = subs[path[-1]]
        words = [*path, "--help"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            parser.parse_args(words)
        except SystemExit as exc:
            if exc.code not in (0, None):
                return [f"`specstudy {' '.join(words)}` is refused: {err.getvalue().strip().splitlines()[-1:]}"]
    return []


@cache
def makefile() -> tuple[frozenset[str], str]:
    text = (ROOT / "Makefile").read_text()
    targets = {t for line in re.findall(r"^([\w.%/ -]+?)\s*:(?!=)", text, re.M) for t in line.split()}
    return frozenset(targets), text


def make_problems(cmd: Command) -> list[str]:
    targets, text = makefile()
    problems = []
    for word in cmd.argv[1:]:
        if word.startswith("-"):
            continue
        m = _ASSIGN.fullmatch(word)
        if m:
            if not re.search(rf"\$[({{]{m.group(1)}[)}}]|^{m.group(1)}\s*\?=", text, re.M):
                problems.append(f"the Makefile never reads {m.group(1)}")
        elif word not in targets:
            problems.append(f"`make {word}`: no such target in the Makefile")
    return problems


# ------------------------------------------------------------------------------------------------- tests
def all_problems(commands, w: Path, env: dict[str, str]) -> dict[Command, list[str]]:
    found = snakemake_problems([c for c in commands if c.runner == "snakemake"], w, env)
    for c in commands:
        if c.runner == "specstudy":
            found[c] = specstudy_problems(c)
        elif c.runner == "make":
            found[c] = make_problems(c)
    return found


def test_every_documented_command_works(login):
    w, env = login
    commands = doc_commands()
    assert sum(c.runner == "snakemake" for c in commands) > 20 and {c.runner for c in commands} == set(RUNNERS)
    found = all_problems(commands, w, env)
    bad = [f"{c.where}: `{c.text}`\n    - " + "\n    - ".join(p) for c, p in found.items()
           if p and c.text not in COUNTER_EXAMPLES]
    assert not bad, "commands in the docs that do not work as written:\n" + "\n".join(bad)
    passing = [f"{c.where}: `{c.text}`" for c, p in found.items() if not p and c.text in COUNTER_EXAMPLES]
    assert not passing, "listed as the wrong form, but they pass the checks (remove them from COUNTER_EXAMPLES):\n" + \
        "\n".join(passing)


BAD_DOC = """\
Re-run a cell: `snakemake --profile profiles/clariden --forcerun results/screen/baseline/rep1/code/c1/summary.json`.

```bash
snakemake --profile profiles/local scren
SPECSTUDY_PARTITION=debug snakemake --profile profiles/clariden results/screen/baseline/rep1/deployment.json
snakemake --configfile config/clariden-70b.yaml report   # the target read as a config file
snakemake --profile profiles/local --until screen report
specstudy rerun --profile profiles/local --forcerun results/x
specstudy plan --cost --config <study.yaml>
make rerun CELLS=results/screen/baseline/rep1/code/c1/summary.json
make studdy
snakemake = str(Path(sys.executable).with_name("snakemake"))
```
"""


def test_the_checks_catch_commands_that_do_not_work(login):
    """The same checks on a constructed doc: each wrong command is caught with its reason, the right ones pass."""
    w, env = login
    commands = commands_in(BAD_DOC, "doc.md")
    texts = [c.text for c in commands]
    assert "make studdy" in texts and not [t for t in texts if "=" in t.split()[1]]  # Python is not a command
    found = {c.text: p for c, p in all_problems(commands, w, env).items()}
    swallowed = found["snakemake --profile profiles/clariden --forcerun results/screen/baseline/rep1/code/c1/summary.json"]
    assert len(swallowed) == 1 and "swallowed by --forcerun" in swallowed[0] and "the default target all" in swallowed[0]
    assert found["snakemake --profile profiles/local scren"] == [
        "the target scren is no rule of the workflow (rules/*.smk, Snakefile)"]
    assert found["SPECSTUDY_PARTITION=debug snakemake --profile profiles/clariden "
                 "results/screen/baseline/rep1/deployment.json"] == []
    assert "swallowed by --configfile" in found["snakemake --configfile config/clariden-70b.yaml report"][0]
    assert "swallowed by --until" in found["snakemake --profile profiles/local --until screen report"][0]
    assert "unrecognized arguments: --forcerun" in found["specstudy rerun --profile profiles/local --forcerun results/x"][0]
    assert found["specstudy plan --cost --config <study.yaml>"] == []
    assert found["make rerun CELLS=results/screen/baseline/rep1/code/c1/summary.json"] == [
        "the Makefile never reads CELLS"]
    assert found["make studdy"] == ["`make studdy`: no such target in the Makefile"]


if __name__ == "__main__":  # list what the test reads: python tests/test_doc_commands.py
    for c in doc_commands():
        print(f"{c.where:<28} {'pattern ' if c.pattern else ''}{c.text}", file=sys.stdout)
