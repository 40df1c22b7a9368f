#!/usr/bin/env bash
# Offline GPU install (docs/gpu.md, "Offline install"):
#   envs/gpu/install_offline.sh hold       # each call but the last: carry one .stage/pN; verified, moved to /tmp
#   envs/gpu/install_offline.sh install    # last call: verify all parts, check python/torch, install the harness
#                                          # into /tmp/specstudy-site and each vLLM build into
#                                          # /tmp/specstudy-engines/vllm-<version>, write their env.sh
# Options: --site DIR (default /tmp/specstudy-site), --engines DIR (default /tmp/specstudy-engines),
#          --holding DIR (default /tmp/specstudy-parts), --python PY.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/install_offline.py" "$@"
