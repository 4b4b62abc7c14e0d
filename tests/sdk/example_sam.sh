#!/usr/bin/env bash
# examples/optimizer_sam_c (SAM in plain C: a wrapper that takes the whole step and re-evaluates
# the model, ABI 1.14) as an author builds and tests it: Kiln installed into a temporary prefix,
# the example built from that prefix alone with find_package(Kiln), described by the installed
# kiln (wraps an optimizer, steps with step_all), then trained over Kiln's sgd against
# pytorch_optimizer.SAM by the example's own test (test_against_torch.py: step losses, one
# re-evaluation per step in the metrics, weights and inner.momentum_buffer within 1e-5 after 10
# steps, straight and resumed).
# Usage: example_sam.sh <kiln build dir> <kiln source dir> <python with torch, safetensors and
#        pytorch-optimizer>
set -euo pipefail
build=$1
src=$2
python=$3
work=$(mktemp -d /tmp/kiln-example-sam.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
cmake -S "$src/examples/optimizer_sam_c" -B "$work/sam" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/sam" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$prefix/bin/kiln" plugins --plugin-path "$work/sam" describe c_sam | tee "$work/describe.log"
grep -qF "c_sam (optimizer)" "$work/describe.log"
grep -q "^  capabilities: .*wraps an optimizer" "$work/describe.log" ||
  { echo "describe lacks 'wraps an optimizer'"; exit 1; }
grep -q "^  steps: .*step_all" "$work/describe.log" || { echo "describe lacks step_all"; exit 1; }
grep -q "^    rho " "$work/describe.log" || { echo "describe lacks option rho"; exit 1; }
"$python" "$src/examples/optimizer_sam_c/test_against_torch.py" --kiln "$prefix/bin/kiln" \
  --plugin-dir "$work/sam"
