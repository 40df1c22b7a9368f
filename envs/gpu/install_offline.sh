#!/usr/bin/env bash
# Offline GPU install (docs/gpu.md, "Offline install"):
#   envs/gpu/install_offline.sh hold       # each call but the last: carry one .stage/pN; verified, moved to /tmp
#   envs/gpu/install_offline.sh install    # last call: verify all parts, check python/torch, install, write env.sh
# Options: --site DIR (default /tmp/specstudy-site), --holding DIR (default /tmp/specstudy-parts), --python PY.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/install_offline.py" "$@"
