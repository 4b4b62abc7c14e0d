#!/usr/bin/env bash
# examples/optimizer_c (Adagrad in plain C) as an author builds and tests it: Kiln installed into a
# temporary prefix, the example built from that prefix alone with find_package(Kiln), described by
# the installed kiln, then trained against torch.optim.Adagrad by the example's own test
# (test_against_torch.py: weights and state within 1e-5 after 20 steps, straight and resumed).
# Usage: example_adagrad.sh <kiln build dir> <kiln source dir> <python with torch and safetensors>
set -euo pipefail
build=$1
src=$2
python=$3
work=$(mktemp -d /tmp/kiln-example-adagrad.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
cmake -S "$src/examples/optimizer_c" -B "$work/adagrad" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/adagrad" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$prefix/bin/kiln" plugins --plugin-path "$work/adagrad" describe c_adagrad | tee "$work/describe.log"
grep -qF "c_adagrad (optimizer)" "$work/describe.log"
for option in lr_decay initial_accumulator_value eps; do
  grep -q "$option" "$work/describe.log" || { echo "describe lacks option $option"; exit 1; }
done
"$python" "$src/examples/optimizer_c/test_against_torch.py" --kiln "$prefix/bin/kiln" \
  --plugin-dir "$work/adagrad"
