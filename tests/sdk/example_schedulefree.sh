#!/usr/bin/env bash
# examples/optimizer_schedulefree_c (Schedule-Free SGD in plain C, evaluation weights of ABI 1.14)
# as an author builds and tests it: Kiln installed into a temporary prefix, the example built from
# that prefix alone with find_package(Kiln), described by the installed kiln (eval_weights shown),
# then trained against schedulefree.SGDScheduleFree by the example's own test
# (test_against_torch.py: step losses, evaluations at x, y, x, z and the per-group scalars of the
# checkpoint, and `kiln export`'s x within 1e-5, straight and resumed).
# Usage: example_schedulefree.sh <kiln build dir> <kiln source dir> <python with torch, safetensors
#        and schedulefree>
set -euo pipefail
build=$1
src=$2
python=$3
work=$(mktemp -d /tmp/kiln-example-schedulefree.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
cmake -S "$src/examples/optimizer_schedulefree_c" -B "$work/sf" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/sf" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$prefix/bin/kiln" plugins --plugin-path "$work/sf" describe c_sgd_schedulefree |
  tee "$work/describe.log"
grep -qF "c_sgd_schedulefree (optimizer)" "$work/describe.log"
grep -q "^  steps: .*eval_weights" "$work/describe.log" || { echo "describe lacks eval_weights"; exit 1; }
for option in momentum warmup_steps r weight_lr_power; do
  grep -q "^    $option " "$work/describe.log" || { echo "describe lacks option $option"; exit 1; }
done
"$python" "$src/examples/optimizer_schedulefree_c/test_against_torch.py" --kiln "$prefix/bin/kiln" \
  --plugin-dir "$work/sf"
