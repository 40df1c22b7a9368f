#!/usr/bin/env bash
# Run the GPU study on a lent, offline GPU machine, across several device calls of at most 10 minutes.
# The study runs in the background (its own session, so it outlives the call that started it while the
# machine stays warm); each call waits, prints progress and packs what exists under $OUT.
#
#   envs/gpu/lease.sh prebuild         # while the parts are still arriving: build the fixture models in the
#                                      # background with the image's torch, then the scale model when the
#                                      # config sets scale_model.build (on the GPU; Snakemake later takes the
#                                      # finished models.json / scale.json as up to date: newer than their inputs)
#   envs/gpu/lease.sh early-wheels     # HERE, after `make gpu-stage`: copy the few wheels the prebuild needs
#                                      # beyond the image (jsonschema and its dependencies) to .stage/early,
#                                      # to be carried with the first part
#   envs/gpu/lease.sh resume DIR|FILE  # a later lease, after the offline install and before start: DIR holds the
#                                      # results.tgz.part* an earlier lease's `wait`/`pack` brought back (carried
#                                      # as .stage/resume), or FILE is such a pack committed recompressed
#                                      # (docs/gpu-results/*/results.tar.xz: it travels with the tree, no carry);
#                                      # the rebuilt models are checked against the packed
#                                      # records (specstudy models-verify), the packed results and Snakemake's
#                                      # metadata restored, and `start` then runs only what is missing
#   envs/gpu/lease.sh start BUDGET_S   # after the offline install: start the study + extras in the background
#   envs/gpu/lease.sh wait  SECONDS    # wait (at most SECONDS) for the background run; print progress; pack
#   envs/gpu/lease.sh pack             # pack results/ (no model weights) and logs into $OUT (<= 15 MB parts)
#
# BUDGET_S: seconds of machine time left for the whole background run (study first, then the start-up
# cache benchmark, then the mechanics point, each only if its estimated time still fits).
# Needs the environment written by the offline installer (envs/gpu/install_offline.py): PATH, PYTHONPATH.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "${SPECSTUDY_WORKDIR:-$REPO}"
LEASE=${SPECSTUDY_LEASE_DIR:-/tmp/specstudy-lease}
CONFIG=${SPECSTUDY_GPU_CONFIG:-config/gpu-h200.yaml}
MECH_CONFIG=${SPECSTUDY_MECH_CONFIG:-config/gpu-h200-mechanics.yaml}
CORES=${SPECSTUDY_CORES:-$(nproc)}
# What the background run asks Snakemake for (default: the whole study); e.g. "profile memory" for the
# extension phases on their declared arms (docs/extensions.md). EXTRAS=0 skips the start-up cache
# benchmark and the mechanics point after it.
TARGETS=${SPECSTUDY_GPU_TARGETS:-all}
# Capacity only (issue 28 item 7): SPECSTUDY_GPU_CAPACITY_ARMS="baseline ngram-k3" runs, instead of the study,
# the capacity job (specstudy deployment run --deployment capacity/<arm>/rep1, as the rule capacity_search
# does) for each named arm, its spec taken from the screening plan (no confirmation before it), then
# `specstudy capacity compare` of the first two arms.
CAPACITY_ARMS=${SPECSTUDY_GPU_CAPACITY_ARMS:-}
EXTRAS=${SPECSTUDY_GPU_EXTRAS:-1}
# After the study, in the same background run: the profile phase of another config (e.g.
# config/gpu-h200-scale-profile.yaml) in its own working directory $LEASE/profile-work, so the study's results/
# stay as the study made them; the models are hard links of the study's, its compile cache a copy. Runs only if
# SPECSTUDY_GPU_PROFILE_S (its estimate, default 480) still fits before the deadline. Its torch-profiler traces
# stay on the machine (tens of MB each): `pack` brings back the profile records, which list every trace file
# with its size and sha256.
PROFILE_CONFIG=${SPECSTUDY_GPU_PROFILE_CONFIG:-}
PROFILE_S=${SPECSTUDY_GPU_PROFILE_S:-480}
# Then, with SPECSTUDY_GPU_PAIR=1 (issue 27 item 2): the better-accepting pair (fixture_models.draft_training
# target_generations, docs/gpu.md "A better pair") built here with the image's torch, and
# benchmarks/acceptance_gap.py in bf16 on CUDA, offline and served, for it and for the study's own pair, on the
# held-out prompts ($LEASE/pair). Only if SPECSTUDY_GPU_PAIR_S (default 420) still fits before the deadline.
PAIR=${SPECSTUDY_GPU_PAIR:-0}
# Instead of the study (first contact with a second engine build): SPECSTUDY_GPU_ENGINES="0.26.0=/tmp/specstudy-engines/
# vllm-0.26.0 0.23.0=/tmp/specstudy-engines/vllm-0.23.0" runs benchmarks/engine_builds.py over those builds and
# SPECSTUDY_GPU_ENGINE_ARMS with $CONFIG's engine settings ($LEASE/engines, packed). SPECSTUDY_GPU_DRAFT_TRAINING
# (JSON, e.g. {"method": "target_generations"}) overrides the config's fixture_models.draft_training in prebuild.
ENGINES=${SPECSTUDY_GPU_ENGINES:-}
ENGINE_ARMS=${SPECSTUDY_GPU_ENGINE_ARMS:-baseline,draft-k3-tp1,draft-k3-tp1+async,ngram-k5}
PAIR_S=${SPECSTUDY_GPU_PAIR_S:-420}
mkdir -p "$LEASE"
now() { date +%s; }
say() { echo "[lease $(date -u +%H:%M:%S)] $*" | tee -a "$LEASE/lease.log"; }

capacity_only() {  # SPECSTUDY_GPU_CAPACITY_ARMS: the capacity job of each arm, on the screening plan
  local t0; t0=$(now)
  local models=""
  python3 -c "import sys; from specstudy.inputs.scale_model import wanted; sys.exit(0 if wanted('$CONFIG') else 1)" \
    && models=results/models/scale/scale.json
  say "capacity only: arms $CAPACITY_ARMS ($CONFIG); plan, corpora and models first"
  snakemake results/plan/screen.json $models --profile "$REPO/profiles/local" --cores "$CORES" --configfile "$CONFIG" \
    > "$LEASE/study.log" 2>&1
  echo $? > "$LEASE/study.rc"
  say "capacity only: plan rc $(cat "$LEASE/study.rc") after $(( $(now) - t0 )) s"
  [ "$(cat "$LEASE/study.rc")" = 0 ] || return
  # the effective config the screening plan was made from (its deployment sections are the capacity job's)
  local cfg; cfg=$(ls -t results/.config/[0-9a-f]*.json | head -n 1)
  mkdir -p results/logs/capacity
  local arm
  for arm in $CAPACITY_ARMS; do
    t0=$(now)
    say "capacity search: $arm"
    specstudy deployment run --plan results/plan/screen.json --deployment "capacity/$arm/rep1" --config "$cfg" \
      --out "results/capacity/$arm" > "results/logs/capacity/$arm.log" 2>&1
    echo $? > "$LEASE/capacity-$arm.rc"
    say "capacity search $arm: rc $(cat "$LEASE/capacity-$arm.rc") after $(( $(now) - t0 )) s"
  done
  # shellcheck disable=SC2086  # CAPACITY_ARMS is a list
  set -- $CAPACITY_ARMS
  if [ $# -ge 2 ] && [ -f "results/capacity/$1/knee.json" ] && [ -f "results/capacity/$2/knee.json" ]; then
    specstudy capacity compare "results/capacity/$1/knee.json" "results/capacity/$2/knee.json" \
      > "$LEASE/capacity-compare.txt" 2>&1
    cat "$LEASE/capacity-compare.txt" | tee -a "$LEASE/lease.log"
  fi
}

profile_after() {  # SPECSTUDY_GPU_PROFILE_CONFIG: the profile phase in its own working directory
  local work="$LEASE/profile-work" t0; t0=$(now)
  say "profile: snakemake profile ($PROFILE_CONFIG) in $work; the study's results/ untouched"
  rm -rf "$work" && mkdir -p "$work/results"
  # the tree without the study's outputs, Snakemake's state or the staged parts
  tar -C "$REPO" --exclude=./results --exclude=./.snakemake --exclude=./.stage --exclude=./.git --exclude=./.venv \
    --exclude=./docs/gpu-results -cf - . \
    | tar -C "$work" -xf -
  cp -al "$PWD/results/models" "$work/results/models" || { say "profile: no models to link"; echo 2 > "$LEASE/profile.rc"; return; }
  [ -d results/.vllm-cache ] && cp -a results/.vllm-cache "$work/results/.vllm-cache"
  # newer than the copied tree, so Snakemake takes the models as built (records: fixture first, its input)
  touch "$work/results/models/fixture/models.json"
  [ -f "$work/results/models/scale/scale.json" ] && touch "$work/results/models/scale/scale.json"
  (cd "$work" && snakemake profile --profile "$REPO/profiles/local" --cores "$CORES" --resources deployments=1 \
    --configfile "$PROFILE_CONFIG" > "$LEASE/profile.log" 2>&1)
  echo $? > "$LEASE/profile.rc"
  say "profile: rc $(cat "$LEASE/profile.rc") after $(( $(now) - t0 )) s"
}

pair_after() {  # SPECSTUDY_GPU_PAIR=1: the better pair's acceptance in bf16 on CUDA beside the study's pair
  local dir="$LEASE/pair" t0; t0=$(now)
  say "better pair: fixture-models --draft-training target_generations ($dir/models), then acceptance_gap in bf16 on cuda"
  rm -rf "$dir" && mkdir -p "$dir"
  specstudy fixture-models --out "$dir/models" --seed 0 --draft-training '{"method": "target_generations"}' \
    > "$dir/build.log" 2>&1
  echo $? > "$LEASE/pair-build.rc"
  say "better pair: build rc $(cat "$LEASE/pair-build.rc") after $(( $(now) - t0 )) s"
  [ "$(cat "$LEASE/pair-build.rc")" = 0 ] || return
  local name models
  for name in better study; do
    models="$dir/models"; [ "$name" = study ] && models="$PWD/results/models/fixture"
    python3 "$REPO/benchmarks/acceptance_gap.py" --models "$models" --k 2,3 --dtypes bfloat16 --device cuda --serve \
      --config "$REPO/config/gpu-h200.yaml" --logdir "$dir/serve-$name" --json "$dir/$name.json" > "$dir/$name.log" 2>&1
    echo $? > "$LEASE/pair-$name.rc"
    say "better pair: acceptance of the $name pair rc $(cat "$LEASE/pair-$name.rc") after $(( $(now) - t0 )) s"
  done
}

if_it_fits() {  # DEADLINE SECONDS NAME FUNCTION: run FUNCTION only if its estimate still fits before DEADLINE
  if (( $(now) + $2 < $1 )); then "$4"; else say "$3 skipped: $(( $1 - $(now) )) s left, needs ~$2"; fi
}

engines_only() {  # instead of the study: benchmarks/engine_builds.py over the builds named in ENGINES
  local deadline=$1 args=() b
  for b in $ENGINES; do args+=(--build "$b"); done
  say "engines: ${ENGINES} (arms ${ENGINE_ARMS}), deadline in $(( deadline - $(now) )) s"
  local t0; t0=$(now)
  python3 "$REPO/benchmarks/engine_builds.py" --config "$CONFIG" "${args[@]}" --arms "$ENGINE_ARMS" \
    --out "$LEASE/engines" --deadline "$(( deadline - 30 ))" > "$LEASE/study.log" 2>&1
  echo $? > "$LEASE/engines.rc"
  say "engines: rc $(cat "$LEASE/engines.rc") after $(( $(now) - t0 )) s"
}

background() {  # the whole background run; writes $LEASE/<stage>.rc as each stage ends
  local deadline=$1
  if [ -n "$ENGINES" ]; then
    engines_only "$deadline"
    touch "$LEASE/done"
    return
  fi
  if [ -n "$CAPACITY_ARMS" ]; then
    capacity_only
    touch "$LEASE/done"
    return
  fi
  say "study: snakemake $TARGETS ($CONFIG) on $CORES cores, one deployment at a time"
  local t0; t0=$(now)
  # shellcheck disable=SC2086  # TARGETS is a list of targets
  snakemake $TARGETS --profile "$REPO/profiles/local" --cores "$CORES" --resources deployments=1 --configfile "$CONFIG" \
    > "$LEASE/study.log" 2>&1
  echo $? > "$LEASE/study.rc"
  say "study: rc $(cat "$LEASE/study.rc") after $(( $(now) - t0 )) s"
  [ -n "$PROFILE_CONFIG" ] && if_it_fits "$deadline" "$PROFILE_S" "profile" profile_after
  [ "$PAIR" = 1 ] && if_it_fits "$deadline" "$PAIR_S" "better pair" pair_after
  if [ "$EXTRAS" = 0 ]; then
    say "extras skipped (SPECSTUDY_GPU_EXTRAS=0)"
    touch "$LEASE/done"
    return
  fi
  if (( $(now) + 300 < deadline )); then
    t0=$(now)
    say "start-up cache benchmark (compiled cold, compiled warm, eager)"
    python3 "$REPO/benchmarks/startup_cache.py" --config "$CONFIG" --logdir "$LEASE/startup-cache" \
      --json "$LEASE/startup_cache.json" > "$LEASE/startup_cache.log" 2>&1
    echo $? > "$LEASE/startup_cache.rc"
    say "start-up cache benchmark: rc $(cat "$LEASE/startup_cache.rc") after $(( $(now) - t0 )) s"
  else
    say "start-up cache benchmark skipped: $(( deadline - $(now) )) s left, needs ~300"
  fi
  if [ -f "$MECH_CONFIG" ] && (( $(now) + 420 < deadline )); then
    t0=$(now)
    say "mechanics point ($MECH_CONFIG)"
    snakemake decode_mechanics --profile "$REPO/profiles/local" --cores "$CORES" --resources deployments=1 \
      --configfile "$CONFIG" > "$LEASE/mechanics.log" 2>&1
    echo $? > "$LEASE/mechanics.rc"
    say "mechanics: rc $(cat "$LEASE/mechanics.rc") after $(( $(now) - t0 )) s"
  else
    say "mechanics skipped: $(( deadline - $(now) )) s left, needs ~420 (or no $MECH_CONFIG)"
  fi
  touch "$LEASE/done"
}

wait_prebuild() {  # a prebuild started from this lease dir, at most 600 s; another lease dir (a second run in
  # the same lease) never waits for a prebuild.done that only the first dir will ever get
  if [ -f "$LEASE/prebuild.started" ] && [ ! -f "$LEASE/prebuild.done" ]; then
    local t0; t0=$(now)
    say "waiting for the prebuild (fixture models, scale model) to finish"
    until [ -f "$LEASE/prebuild.done" ] || (( $(now) > t0 + 600 )); do sleep 2; done
    [ -f "$LEASE/prebuild.done" ] || say "prebuild not done after 600 s: the study's rules build what is missing"
  fi
}

resume() {  # DIR: results.tgz.part* of an earlier lease, or FILE: such a pack recompressed (*.tar.xz); the
  # rebuilt models must be the packed records' models
  local dir=$1 parts=""
  if [ -f "$dir" ]; then
    case "$dir" in
      *.tar.xz|*.txz) ;;
      *) say "resume: $dir is a file but not a .tar.xz pack (give the folder of results.tgz.part* or a committed results.tar.xz)"; return 2 ;;
    esac
  else
    parts=$(ls "$dir"/results.tgz.part* 2>/dev/null) || true
    [ -n "$parts" ] || { say "resume: no results.tgz.part* in $dir (copy an earlier lease's parts there, or give a committed results.tar.xz)"; return 2; }
  fi
  wait_prebuild
  rm -rf "$LEASE/resume" && mkdir -p "$LEASE/resume"
  if [ -z "$parts" ]; then
    # Python's lzma, not xz(1): the GPU image need not have xz-utils
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$dir" 2>/dev/null \
      | tar -xf - -C "$LEASE/resume" && [ "${PIPESTATUS[0]}" = 0 ] || { say "resume: $dir is not a readable .tar.xz"; return 2; }
  else
    # shellcheck disable=SC2086  # parts: the sorted part files
    cat $parts | tar -xzf - -C "$LEASE/resume" || { say "resume: the parts in $dir do not make one archive"; return 2; }
  fi
  [ -d "$LEASE/resume/results" ] || { say "resume: no results/ in the archive from $dir"; return 2; }
  [ -d "$LEASE/resume/.snakemake/metadata" ] || { say "resume: the archive has no .snakemake/metadata (packed before it was kept): Snakemake would re-run every job; start afresh"; return 2; }
  if ! specstudy models-verify --records "$LEASE/resume/results/models" --models results/models | tee -a "$LEASE/lease.log"; then
    say "resume refused: the rebuilt models are not the ones the packed results were measured with; nothing restored"
    return 3
  fi
  # the packed records replace the rebuilt ones (their content and mtimes); the rebuilt weights stay.
  # Snakemake's metadata comes back too: the device call copies the tree anew, so every config, corpus and
  # script file is newer than the packed outputs, and only the recorded input checksums let Snakemake see
  # that nothing changed (without them it re-runs every job). Same commit only (docs/gpu.md).
  cp -a "$LEASE/resume/results/." results/
  mkdir -p .snakemake && cp -a "$LEASE/resume/.snakemake/." .snakemake/
  touch "$LEASE/resumed"
  say "resumed from $dir: $(find results -path '*/attempts/*' -name summary.json | wc -l) cells, $(find "$LEASE/resume/.snakemake/metadata" -type f 2>/dev/null | wc -l) Snakemake output records; start runs what is missing"
}

touch_prebuilt() {  # the prebuilt records, newer than the tree's files (a device call may re-copy them, with new mtimes)
  if [ "$(cat "$LEASE/prebuild.rc" 2>/dev/null)" = 0 ] && [ -f results/models/fixture/models.json ]; then
    touch results/models/fixture/models.json
    if [ "$(cat "$LEASE/scale.rc" 2>/dev/null)" = 0 ] && [ -f results/models/scale/scale.json ]; then
      touch results/models/scale/scale.json   # after models.json, its input
    fi
    say "prebuilt model records touched (built in this lease from this tree): Snakemake takes them as up to date"
  fi
}

progress() {
  local cells; cells=$(find results -path '*/attempts/*' -name summary.json 2>/dev/null | wc -l)
  local deps; deps=$(find results -path '*/attempts/*' -name launch.log 2>/dev/null | wc -l)
  say "progress: $deps server launches, $cells cells measured; last study lines:"
  tail -n 3 "$LEASE/study.log" 2>/dev/null | cut -c1-200
  nvidia-smi --query-gpu=memory.used,utilization.gpu,power.draw --format=csv,noheader 2>/dev/null | sed 's/^/  gpu: /' || true  # none here: no line
}

pack() {
  [ -n "${OUT:-}" ] || { echo "pack: OUT is not set (run on the device machine)"; return 2; }
  mkdir -p "$LEASE/logs"
  cp .snakemake/log/*.log "$LEASE/logs/" 2>/dev/null
  # no weights (the models are rebuilt from their seeds), but their records, configs and tokenizers
  # nor the torch-profiler traces (tens of MB each; the profile records list them with size and sha256)
  tar --exclude='*.safetensors' --exclude='results/.vllm-cache*' --exclude='results/mechanics/models' \
      --exclude='*.pt.trace.json*' --exclude='*.profiler_out.txt' \
      -czf "$LEASE/results.tgz" results .snakemake/metadata .snakemake/incomplete "$LEASE"/*.log "$LEASE"/*.json "$LEASE"/*.rc "$LEASE"/*.txt "$LEASE/logs" \
      "$LEASE/startup-cache" "$LEASE/profile-work/results" "$LEASE/pair" "$LEASE/engines" 2>/dev/null
  # split beside the archive, then swap the parts into $OUT: a device call killed at its limit (the
  # session's device time ran out) still brings back the last complete pack of a `wait`
  rm -rf "$LEASE/parts" && mkdir -p "$LEASE/parts"
  split -b 15M -d -a 1 "$LEASE/results.tgz" "$LEASE/parts/results.tgz.part"
  rm -f "$OUT"/results.tgz.part*
  cp "$LEASE"/parts/results.tgz.part* "$OUT/"
  cp "$LEASE/lease.log" "$OUT/lease.log" 2>/dev/null
  [ "${1:-}" = quiet ] || ls -la "$OUT"
}

case "${1:-}" in
  early-wheels)
    cache=${SPECSTUDY_GPU_WHEEL_CACHE:-$HOME/.cache/specstudy/gpu-wheels}/wheels
    mkdir -p "$REPO/.stage/early"
    for w in jsonschema-4 jsonschema_specifications referencing rpds_py typing_extensions; do
      cp "$cache"/$w*.whl "$REPO/.stage/early/" || { echo "early-wheels: no $w wheel in $cache (run make gpu-stage)"; exit 2; }
    done
    du -sh "$REPO/.stage/early" ;;
  prebuild)
    mkdir -p results/logs/models
    early=""
    if ls "$REPO"/.stage/early/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/specstudy-early "$REPO"/.stage/early/*.whl \
        && early=/tmp/specstudy-early
    fi
    rm -f "$LEASE/prebuild.done"
    touch "$LEASE/prebuild.started"   # `start` waits for prebuild.done only where this lease dir started one
    say "prebuild: fixture models (results/models/fixture), then the scale model if $CONFIG asks for it, in the background"
    setsid nohup bash "$0" _prebuild "$early" < /dev/null > "$LEASE/prebuild.log" 2>&1 &
    sleep 2; tail -n 2 results/logs/models/fixture.log ;;
  _prebuild)  # the background body of prebuild: fixture models, then the scale model (scale_model.build)
    export PYTHONPATH="${2:-}${2:+:}$REPO/scripts${PYTHONPATH:+:$PYTHONPATH}"
    t0=$(now)
    python3 -c "import yaml; fm = yaml.safe_load(open('$CONFIG'))['fixture_models']; \
from specstudy.inputs.fixture_models import build_fixture_models; \
import json, os; dt = os.environ.get('SPECSTUDY_GPU_DRAFT_TRAINING'); \
build_fixture_models('results/models/fixture', seed=fm.get('seed', 0), draft_preset=fm.get('draft_preset', 'default'), \
draft_training=json.loads(dt) if dt else fm.get('draft_training'))" \
      > results/logs/models/fixture.log 2>&1
    echo $? > "$LEASE/prebuild.rc"
    say "prebuild: rc $(cat "$LEASE/prebuild.rc") after $(( $(now) - t0 )) s"
    if [ "$(cat "$LEASE/prebuild.rc")" = 0 ] && python3 -c "import sys; from specstudy.inputs.scale_model import wanted; sys.exit(0 if wanted('$CONFIG') else 1)"; then
      t0=$(now)
      say "prebuild: scale model (results/models/scale) on the GPU"
      python3 -c "from specstudy.inputs.scale_model import build_from_config; build_from_config('$CONFIG')" \
        > results/logs/models/scale.log 2>&1
      echo $? > "$LEASE/scale.rc"
      say "prebuild: scale model rc $(cat "$LEASE/scale.rc") after $(( $(now) - t0 )) s"
    fi
    touch "$LEASE/prebuild.done" ;;
  start)
    budget=${2:?usage: lease.sh start BUDGET_S}
    deadline=$(( $(now) + budget ))
    wait_prebuild
    rm -f "$LEASE/done"   # a second background run from the same lease dir is waited for anew
    [ -f "$LEASE/prebuild.rc" ] && say "prebuild rc $(cat "$LEASE/prebuild.rc")"
    [ -f "$LEASE/scale.rc" ] && say "scale model prebuild rc $(cat "$LEASE/scale.rc") (a failure is retried by the study's rule scale_models)"
    touch_prebuilt
    nvidia-smi > "$LEASE/nvidia-smi.txt" 2>&1
    say "background run starts; deadline in $budget s"
    setsid nohup bash "$0" _background "$deadline" > "$LEASE/background.log" 2>&1 < /dev/null &
    sleep "${SPECSTUDY_LEASE_START_SLEEP_S:-5}"; progress ;;  # the first progress line after the run got going
  _background) background "$2" ;;
  _touch_prebuilt) touch_prebuilt ;;
  resume) resume "${2:?usage: lease.sh resume DIR|FILE.tar.xz}" ;;
  wait)
    limit=$(( $(now) + ${2:?usage: lease.sh wait SECONDS} ))
    every=${SPECSTUDY_LEASE_PACK_S:-120}; next_pack=$(( $(now) + every ))
    while [ ! -f "$LEASE/done" ] && (( $(now) < limit )); do
      sleep "${SPECSTUDY_LEASE_POLL_S:-20}"; progress
      # pack every SPECSTUDY_LEASE_PACK_S seconds too: a call cut short keeps what ran until its last pack
      if (( $(now) >= next_pack )); then pack quiet; say "packed (interim)"; next_pack=$(( $(now) + every )); fi
    done
    [ -f "$LEASE/done" ] && say "background run finished"
    pack ;;
  pack) pack ;;
  *) echo "usage: lease.sh early-wheels | prebuild | resume DIR|FILE.tar.xz | start BUDGET_S | wait SECONDS | pack"; exit 2 ;;
esac
