#!/usr/bin/env bash
# The GPU checklist of docs/device.md as one resumable script for the device tool:
#
#   scripts/device_check.sh [SECONDS]    (there, carrying .devkit; SECONDS: this call's budget,
#                                         default 540)
#
# Runs, in order, the phases below that have not finished on this (warm) machine yet, and stops
# before a phase that would not fit in what is left of SECONDS; call it again at once (the machine
# stays warm for 30 s) to go on. Each phase's output goes to $OUT/<phase>.log (the tool brings
# $OUT back) and a stamp in build/device/check marks it done.
#   build     scripts/device_build.sh build (configure + ninja on all cores); skipped when the
#             benches can run the kiln that `scripts/device_build.sh pack` installed into
#             .devkit/prebuilt here (same sources, loads there) and no test phase is chosen
#   cuda      the tests that need a GPU or change on one (names with Cuda/cuda, the C API
#             sessions, the capability refusals)
#   gpu32     bench/gpu_throughput.py at batch 32, amp and tf32
#   graphs    bench/gpu_throughput.py at batch 1 and 2, amp eager and amp_graph
#   gpu256    bench/gpu_throughput.py at batch 256, amp and tf32 (12 loader workers: with 4, both
#             sides waited 14-56 ms a step on their loaders beside a 55-70 ms step on an H100
#             host, so the table measured the loaders as much as the step)
#   nccl      bench/nccl_world1.py: kiln launch --nproc 1 (NCCL, DDP) against kiln run
#   memory    bench/memory.py --device cuda
#   compile32, compile256
#             bench/gpu_throughput.py --torch-compile default (issue 28): Kiln amp eager and
#             graphed against eager PyTorch and torch.compile at batch 32, then 256 (inductor's
#             cold compile of ResNet-50: 50 s on an H100); KILN_CHECK_PHASES="compile" names both
#   autotune32, autotune256
#             the same against torch.compile max-autotune (Kiln eager and graphed): its cold compile
#             (Triton templates benchmarked per convolution) ran over 240 s at batch 32 on an
#             H100 and was cut off, so each needs a call of its own; inductor's cache lives in
#             build/device/inductor-<phase>, so a phase cut off by the call's limit resumes
#             its compile when called again at once (the machine still warm), and its table
#             then says the compile was not cold; KILN_CHECK_PHASES="autotune" names both.
#             The compiled arm runs first (--compiled-first), so the compile starts at once (in the
#             fifth run the eager arms took the first 105 s of the call)
#   profile256
#             Kiln's and PyTorch's ResNet-50 AMP step at batch 256 traced (run.profile_steps and
#             torch.profiler, 3 steps each, into $OUT/traces as .json.gz), then bench/trace_diff.py:
#             the kernels whose time differs most, per step (where Kiln's longer step goes)
#   precision bench/precision.py --device cuda, the small resnet on Fashion-MNIST in each precision
#             mode (fp32, tf32, amp, O2, O3), Kiln against PyTorch, one run each. It reads
#             .devdata/fashion-mnist (30 MiB, which `fetch` copies there): the call carries
#             .devkit/debs, .devkit/prebuilt and .devdata, since with .devkit/pylib the tree
#             would pass the tool's 64 MiB
#   suite     the whole suite, ctest -j16 (over 7 minutes on an H200 machine's 16 cores)
# An autotune phase cut off by the call's limit also leaves its inductor cache in
# $OUT/inductor-<phase>.tgz (whole when it packs into 16 MiB, what a call can carry beside
# .devkit, else its autotuning results alone: keep_inductor_cache). Moved here into .devkit/,
# the next session's call carries it, and the phase resumes the compile from it on a card of the
# same kind (inductor keys its autotuning results by device), instead of starting cold again.
# KILN_CHECK_PHASES="build cuda gpu256 ..." runs only those, in that order (a session with less
# device time puts first what has not been measured yet). KILN_CHECK_FORCE=1 starts a phase even
# when its estimate exceeds what is left: for an autotune phase cut off once, whose compile resumes
# from its cache (the fifth GPU run's second call was refused with 269 s left).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
BUDGET="${1:-540}"
START=$SECONDS
DONE="$ROOT/build/device/check"
OUTDIR="${OUT:-$ROOT/build/device/check-out}"
mkdir -p "$DONE" "$OUTDIR"
B="$ROOT/build/device"
X=(scripts/device_build.sh exec)

# The kiln the benches run: the one `scripts/device_build.sh pack` installed into .devkit/prebuilt
# here before the call, while it matches the sources sent and loads on this machine (then the
# build is skipped unless a test phase needs the tree), else the one built here.
# KILN_CHECK_PREBUILT=0 always builds.
K="$B/bin/kiln"
PREBUILT=
if [ "${KILN_CHECK_PREBUILT:-1}" != 0 ] && prebuilt="$(scripts/device_build.sh prebuilt 2>"$OUTDIR/prebuilt.log")"; then
  K="$prebuilt"
  PREBUILT=1
fi

# phase  estimated-seconds  command
PHASES=(
  "build|420|scripts/device_build.sh build"
  "cuda|90|scripts/device_build.sh test -j16 --timeout 300 -R 'Cuda|cuda|Sessions|Capabilities|MemoryFormat|ReplaysDropout'"
  "gpu32|130|${X[*]} python3 bench/gpu_throughput.py --device cuda --kiln $K --batches 32 --steps 120 --warmup 30 --repeats 1 --settle 0.2"
  "graphs|120|${X[*]} python3 bench/gpu_throughput.py --device cuda --kiln $K --batches 1,2 --modes amp,amp_graph --steps 300 --warmup 50 --repeats 1 --settle 0.2"
  "gpu256|150|${X[*]} python3 bench/gpu_throughput.py --device cuda --kiln $K --batches 256 --steps 60 --warmup 20 --repeats 1 --samples 4096 --settle 0.2 --workers 12"
  "nccl|140|${X[*]} python3 bench/nccl_world1.py --kiln $K --batch 64 --steps 80 --warmup 20 --repeats 3"
  "memory|90|${X[*]} python3 bench/memory.py --device cuda --kiln $K --repeats 1"
  "compile32|200|${X[*]} python3 bench/gpu_throughput.py --device cuda --kiln $K --batches 32 --modes amp,amp_graph --torch-compile default --steps 120 --warmup 30 --repeats 1 --settle 0.2"
  "compile256|220|${X[*]} python3 bench/gpu_throughput.py --device cuda --kiln $K --batches 256 --modes amp,amp_graph --torch-compile default --steps 60 --warmup 20 --repeats 1 --samples 2048 --settle 0.2 --workers 12"
  "autotune32|420|${X[*]} python3 bench/gpu_throughput.py --device cuda --kiln $K --batches 32 --modes amp,amp_graph --torch-compile max-autotune --compiled-first --steps 120 --warmup 30 --repeats 1 --settle 0.2 --compile-cache $B/inductor-autotune32"
  "autotune256|480|${X[*]} python3 bench/gpu_throughput.py --device cuda --kiln $K --batches 256 --modes amp,amp_graph --torch-compile max-autotune --compiled-first --steps 60 --warmup 20 --repeats 1 --samples 2048 --settle 0.2 --workers 12 --compile-cache $B/inductor-autotune256"
  "profile256|150|${X[*]} python3 bench/gpu_throughput.py --device cuda --kiln $K --batches 256 --modes amp --steps 16 --warmup 10 --repeats 1 --samples 2048 --settle 0.2 --workers 12 --profile $OUTDIR/traces && python3 bench/trace_diff.py $OUTDIR/traces/rep0-b256-amp-kiln.json.gz $OUTDIR/traces/rep0-b256-amp-torch.json.gz --labels Kiln,PyTorch --top 30"
  "precision|150|[ -d .devdata/fashion-mnist ] || { echo 'precision: no .devdata/fashion-mnist (scripts/device_build.sh fetch puts it there; carry .devkit/debs, .devkit/prebuilt and .devdata, not the whole .devkit: 64 MiB)'; exit 2; } && ${X[*]} python3 bench/precision.py --device cuda --kiln $K --data-root $ROOT/.devdata/fashion-mnist --cases resnet --steps 300 --warmup 30 --repeats 1 --settle 0.2"
  "suite|300|scripts/device_build.sh test -j16 --timeout 300"
)

BUILD_PHASE="${PHASES[0]}"
if [ -n "${KILN_CHECK_PHASES:-}" ]; then
  chosen=()
  wants=()
  for want in $KILN_CHECK_PHASES; do  # "compile" and "autotune" stand for their two phases
    case "$want" in
      compile | autotune) wants+=("${want}32" "${want}256") ;;
      *) wants+=("$want") ;;
    esac
  done
  for want in "${wants[@]}"; do
    found=
    for entry in "${PHASES[@]}"; do [ "${entry%%|*}" = "$want" ] && { chosen+=("$entry"); found=1; }; done
    [ -n "$found" ] || { echo "device_check: unknown phase '$want'" >&2; exit 2; }
  done
  PHASES=("${chosen[@]}")
fi

# Without a usable prebuilt kiln the benches need the one built here: build first if the chosen
# phases leave the build out and this machine has none yet.
if [ -z "$PREBUILT" ] && [ ! -x "$B/bin/kiln" ] && [ "${PHASES[0]%%|*}" != build ]; then
  echo "device_check: no usable prebuilt kiln ($OUTDIR/prebuilt.log) and none built here: building first"
  PHASES=("$BUILD_PHASE" "${PHASES[@]}")
fi

# Only the test phases need the built tree when the prebuilt kiln serves the benches.
NEEDS_TREE=
for entry in "${PHASES[@]}"; do
  case "${entry%%|*}" in cuda | suite) NEEDS_TREE=1 ;; esac
done

# The device tool brings back at most 8 files from $OUT: past that, the logs go into one
# $OUT/logs.tgz so that traces and inductor caches still come back (the sixth GPU run lost
# profile256's log and traces to the count).
bundle_logs() {
  [ -n "${OUT:-}" ] || return 0
  local count
  count=$(find "$OUTDIR" -type f | wc -l)
  [ "$count" -le 8 ] && return 0
  (cd "$OUTDIR" && tar czf logs.tgz ./*.log && rm -f ./*.log) &&
    echo "device_check: $count files in \$OUT, more than the 8 that come back: the logs are in \$OUT/logs.tgz"
}
trap bundle_logs EXIT

# An autotune phase cut off: its inductor cache into $OUT/inductor-<phase>.tgz, for .devkit/. The
# tree a call carries is at most 64 MiB, and .devkit already holds about 40, so past 16 MiB only
# the autotuning results go: the timings of every choice per operator (cache/, one JSON file per
# device) and the pointwise kernels' best configs (*.best_config). With them the next compile
# benchmarks nothing it has timed and compiles only the winners (checked on a CPU max-autotune
# compile: no "autotune" lines with cache/ alone, 11 without).
keep_inductor_cache() {
  local name=$1 saved="$OUTDIR/inductor-$1.tgz"
  tar czf "$saved" -C "$B" "inductor-$name"
  if [ "$(du -m "$saved" | cut -f1)" -gt 16 ]; then
    echo "== $name: its inductor cache, $(du -m "$saved" | cut -f1) MiB packed, is too big to carry: keeping its autotuning results alone"
    (cd "$B" && find "inductor-$name" -type f \( -path "inductor-$name/cache/*" -o -name '*.best_config' \) |
      tar czf "$saved" -T -)
  fi
  if [ "$(du -m "$saved" | cut -f1)" -le 16 ]; then
    echo "== $name: its inductor cache is in \$OUT/inductor-$name.tgz; put it in .devkit/ for the next GPU"
  else
    echo "== $name: even its autotuning results, $(du -m "$saved" | cut -f1) MiB packed, are too big to carry"
    rm -f "$saved"
  fi
}

export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUTDIR/gpu.txt"
if [ -n "$PREBUILT" ]; then
  echo "kiln: $K (prebuilt here by scripts/device_build.sh pack, sources match)" | tee -a "$OUTDIR/gpu.txt"
else
  echo "kiln: $K (built on this machine; $(tail -1 "$OUTDIR/prebuilt.log" 2>/dev/null || echo 'prebuilt: off'))" |
    tee -a "$OUTDIR/gpu.txt"
fi
for entry in "${PHASES[@]}"; do
  IFS='|' read -r name estimate cmd <<<"$entry"
  [ -f "$DONE/$name" ] && { echo "== $name: done earlier"; continue; }
  if [ "$name" = build ] && [ -n "$PREBUILT" ] && [ -z "$NEEDS_TREE" ]; then
    echo "== build: skipped (the benches run the prebuilt kiln; no test phase chosen)"
    continue
  fi
  left=$((BUDGET - (SECONDS - START)))
  # The build resumes where it stopped, so it always runs; the others need their estimate.
  if [ "$name" != build ] && [ "${KILN_CHECK_FORCE:-0}" != 1 ] && [ "$left" -lt "$estimate" ]; then
    echo "== $name: needs ~${estimate}s, ${left}s left: stopping here; call again to go on"
    exit 3
  fi
  cache="$B/inductor-$name" kept="$ROOT/.devkit/inductor-$name.tgz"
  if [[ $name == autotune* && -f $kept && ! -d $cache ]]; then
    mkdir -p "$B" && tar xzf "$kept" -C "$B" && echo "== $name: resuming inductor's cache from $kept"
  fi
  echo "== $name ($((SECONDS - START))s in): $cmd"
  t0=$SECONDS
  timeout --signal=INT --kill-after=10 "$((left > 20 ? left - 10 : 10))" bash -c "$cmd" >"$OUTDIR/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  tail -25 "$OUTDIR/$name.log"
  # A test phase is done once it ran: its failures are in its log, and running it again would
  # not change them.
  if [ $rc -eq 0 ] || [ "$name" = cuda ] || [ "$name" = suite ]; then touch "$DONE/$name"; fi
  if [[ $name == autotune* && $rc -ne 0 && -d $cache ]]; then keep_inductor_cache "$name"; fi
  if [ "$name" = build ] && [ $rc -ne 0 ]; then echo "== the build failed; stopping"; exit 1; fi
done
echo "== all phases done in $((SECONDS - START))s"
