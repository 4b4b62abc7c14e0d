#!/usr/bin/env bash
# The Rust binding (bindings/rust/kiln) against this build's libkiln: builds the crate and its
# example offline, runs its tests, then trains the example on a small synthetic pipeline and
# checks that the accuracy it prints rises and that --target stops early.
#   usage: rust_test.sh <build_dir> <source_dir>
# Exits 77 (ctest: skipped) only when no cargo exists at all.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 <build_dir> <source_dir>" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)

cargo=$(command -v cargo || true)
if [ -z "$cargo" ] && [ -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
  cargo="${HOME:-/root}/.cargo/bin/cargo"
fi
if [ -z "$cargo" ]; then
  echo "rust_test: SKIPPED: no cargo on PATH or in ~/.cargo/bin (install Rust >= 1.63, e.g. apt-get install cargo)" >&2
  exit 77
fi
if [ ! -e "$build/lib/libkiln.so" ]; then
  echo "rust_test: $build/lib/libkiln.so not found: build the kiln library target first" >&2
  exit 1
fi

export KILN_LIB_DIR="$build/lib"
export KILN_SOURCE_DIR="$source"
# Build output stays in the build folder, never in the source tree.
export CARGO_TARGET_DIR="$build/rust-target"
# Keep two cores' worth of jobs; torch inside the tests uses its own threads.
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

# A sanitized build (the asan preset) links libkiln against libasan, which must be the first
# library of a process; the Rust binaries are not instrumented, so preload it into them (only
# them: cargo's runner wraps test binaries, not cargo or rustc). Leak checking stays as the
# caller's ASAN_OPTIONS say.
run=()
asan=$(ldd "$build/lib/libkiln.so" 2>/dev/null | awk '/libasan/ { print $3; exit }')
if [ -n "$asan" ]; then
  rustc="${RUSTC:-$(dirname "$cargo")/rustc}"
  [ -x "$rustc" ] || rustc=rustc
  host=$("$rustc" -vV | sed -n 's/^host: //p')
  host_var=$(echo "$host" | tr 'a-z.-' 'A-Z__')
  export "CARGO_TARGET_${host_var}_RUNNER=env LD_PRELOAD=$asan"
  run=(env "LD_PRELOAD=$asan")
  echo "== libkiln uses $asan: preloading it into the Rust binaries"
fi

crate="$source/bindings/rust/kiln"
cd "$crate"
echo "== $("$cargo" --version) in $crate"
"$cargo" build --offline --examples
"$cargo" test --offline -- --test-threads=1

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-rust-example.XXXXXX")
trap 'rm -rf "$work"' EXIT
# 512 images of 8x8, an MLP, a small learning rate: three epochs of rising accuracy in a
# second or two.
cat > "$work/pipeline.toml" <<EOF
[run]
device = "cpu"
epochs = 3
seed = 3
checkpoints = false
tensorboard = false
output_dir = "$work/out"

[data]
dataset = "synthetic"
synthetic_train = 512
synthetic_test = 256
height = 8
width = 8
batch_size = 32
workers = 0

[model]
name = "mlp"
hidden = [32]

[optimizer]
name = "sgd"
lr = 0.02
momentum = 0.9

[precision]
name = "fp32"
EOF
train=("${run[@]}" "$CARGO_TARGET_DIR/debug/examples/train")

echo "== example: three epochs"
"${train[@]}" "$work/pipeline.toml" --set run.seed=1 | tee "$work/train.log"
# Lines "epoch N/3: accuracy A ...": three of them, and the last above the first.
awk '
  $1 == "epoch" && $3 == "accuracy" { acc[++n] = $4 }
  /^final state: finished after 48 of 48 steps/ { done = 1 }
  END {
    if (n != 3) { print "rust_test: expected 3 epoch lines, got " n; exit 1 }
    if (!(acc[3] > acc[1])) { print "rust_test: accuracy did not rise: " acc[1] " -> " acc[3]; exit 1 }
    if (!done) { print "rust_test: no \"final state: finished after 48 of 48 steps\" line"; exit 1 }
    print "rust_test: accuracy " acc[1] " -> " acc[2] " -> " acc[3]
  }' "$work/train.log"

echo "== example: --target stops after the first epoch"
"${train[@]}" "$work/pipeline.toml" --target 0.05 | tee "$work/target.log"
grep -q '^epoch 1/3: accuracy' "$work/target.log"
if grep -q '^epoch 2/3' "$work/target.log"; then
  echo "rust_test: --target 0.05 did not stop after epoch 1" >&2
  exit 1
fi
grep -q '^final state: ready after 16 of 48 steps (target 0.0500 reached' "$work/target.log"

echo "== example: a misspelt key fails with the library's message"
set +e
"${train[@]}" "$work/pipeline.toml" --set optimizer.lrr=0.1 > "$work/bad.log" 2>&1
rc=$?
set -e
cat "$work/bad.log"
if [ $rc -ne 1 ] || ! grep -q "CONFIG: .*optimizer.lrr.*'lr'" "$work/bad.log"; then
  echo "rust_test: expected exit 1 and a CONFIG error suggesting 'lr' (exit $rc)" >&2
  exit 1
fi
echo "rust_test: OK"
