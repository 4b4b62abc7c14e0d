#!/usr/bin/env bash
# examples/lr_policy_plateau_c (ReduceLROnPlateau in plain C: an LR policy that reacts to
# evaluations and keeps its state in checkpoints, ABI 1.15) as an author builds and tests it:
# Kiln installed into a temporary prefix, the example built from that prefix alone with
# find_package(Kiln), described by the installed kiln (observe, get_state, set_state), then run
# by the example's own test (test_against_torch.py: every step's rate equals torch's
# ReduceLROnPlateau fed the run's evaluations; a resumed run continues at the same rates).
# Usage: example_plateau.sh <kiln build dir> <kiln source dir> <python with torch and safetensors>
set -euo pipefail
build=$1
src=$2
python=$3
work=$(mktemp -d /tmp/kiln-example-plateau.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
cmake -S "$src/examples/lr_policy_plateau_c" -B "$work/plateau" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/plateau" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$prefix/bin/kiln" plugins --plugin-path "$work/plateau" describe c_plateau | tee "$work/describe.log"
grep -qF "c_plateau (lr_policy)" "$work/describe.log"
grep -q "^  schedule: .*reacts to evaluations (observe)" "$work/describe.log" ||
  { echo "describe lacks observe"; exit 1; }
grep -q "^  schedule: .*checkpointed state" "$work/describe.log" ||
  { echo "describe lacks get_state/set_state"; exit 1; }
"$python" "$src/examples/lr_policy_plateau_c/test_against_torch.py" --kiln "$prefix/bin/kiln" \
  --plugin-dir "$work/plateau"
