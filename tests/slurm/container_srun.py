"""``srun`` with a stand-in for the CSCS Container Engine's ``--environment=<EDF>`` option.

tests/slurm/cluster.py installs this as the local cluster's ``srun``: ``container_srun.py <real srun> ARGS``.
Without ``--environment`` it runs the real ``srun`` unchanged. With it, it refuses what the Container
Engine refuses before a step starts, then runs the real ``srun`` without the option:

* the EDF: a path (absolute, relative, or a name looked up as ``$HOME/.edf/<name>.toml``) that must
  exist and parse as TOML;
* ``image``: required; a file path (not a registry reference ``registry#image`` or ``docker://``)
  must exist after ``${VAR}`` expansion;
* ``mounts``: each ``src:dst[:flags]`` needs an existing ``src`` (after ``${VAR}`` expansion);
* ``[env]``: the variables are set for the step (the container's environment; expanded like the
  engine does), which is what makes the step see, e.g., ``HF_HUB_OFFLINE``.

What it cannot stand in for: the image's file system (the step runs the host's programs) and the
annotations' hooks. Refusals exit 1 with one ``srun: error: ...`` line naming the EDF, the field and
the value, as the engine does (pyxis/enroot messages differ in wording).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand(value: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), str(value))


def _refuse(message: str) -> None:
    print(f"srun: error: container engine: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def _edf_path(value: str) -> Path:
    p = Path(value)
    if "/" in value or value.endswith(".toml"):
        return p
    return Path(os.environ.get("HOME", "/root")) / ".edf" / f"{value}.toml"


def _is_registry(image: str) -> bool:
    return "://" in image or ("#" in image and not image.startswith("/"))


def check_edf(value: str, env: dict[str, str]) -> dict[str, str]:
    """The step's extra environment from the EDF at ``value``; exits 1 on what the engine refuses."""
    path = _edf_path(value)
    if not path.is_file():
        _refuse(f"environment definition file {path} not found (--environment={value})")
    try:
        edf = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        _refuse(f"{path}: cannot parse the environment definition file: {exc}")
    image = edf.get("image")
    if not image or not isinstance(image, str):
        _refuse(f"{path}: field 'image' is missing")
    image = _expand(image, env)
    if not _is_registry(image) and not Path(image).is_file():
        _refuse(f"{path}: image {image} does not exist")
    for mount in edf.get("mounts") or []:
        src = _expand(str(mount).split(":", 1)[0], env)
        if not src or not Path(src).exists():
            _refuse(f"{path}: mount source {src or '(empty)'} of {mount!r} does not exist")
    return {str(k): _expand(str(v), env) for k, v in (edf.get("env") or {}).items()}


def main(argv: list[str]) -> None:
    real, args = argv[0], argv[1:]
    out: list[str] = []
    edf: str | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):  # the command and its arguments: not srun's options
            out.extend(args[i:])
            break
        if a.startswith("--environment="):
            edf = a.split("=", 1)[1]
        elif a == "--environment" and i + 1 < len(args):
            edf = args[i + 1]
            i += 1
        else:
            out.append(a)
        i += 1
    env = dict(os.environ)
    if edf is not None:
        env.update(check_edf(edf, env))
    os.execve(real, [real, *out], env)


if __name__ == "__main__":
    main(sys.argv[1:])
