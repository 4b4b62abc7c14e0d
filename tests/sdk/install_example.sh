#!/usr/bin/env bash
# Installs Kiln into a temporary prefix, builds the examples from that prefix alone —
# examples/lr_policy_c (find_package(Kiln), and pkg-config for a build without CMake),
# examples/optimizer_cpp and examples/model_cpp (find_package(Kiln) + the LibTorch the host
# runs) — and trains a
# pipeline with the installed kiln and both: the lr must follow base_lr * min(1, sqrt(offset /
# iter)) and the loss must fall.
# Usage: install_example.sh <kiln build dir> <kiln source dir> <torch cmake prefix>
set -euo pipefail
build=$1
src=$2
torch_prefix=$3
work=$(mktemp -d /tmp/kiln-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in bin/kiln include/kiln/abi.h include/kiln/torch.hpp lib/cmake/Kiln/KilnConfig.cmake \
  lib/pkgconfig/kiln-sdk.pc lib/kiln/plugins/libkiln_sgd.so lib/kiln/plugins/libkiln_mlp.so \
  include/kiln/kiln.h lib/libkiln.so lib/pkgconfig/kiln.pc; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

# The example as a separate CMake project that finds the installed SDK.
cmake -S "$src/examples/lr_policy_c" -B "$work/example" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log"
cmake --build "$work/example" >"$work/build.log"
# Only the two entry points are exported.
exported=$(nm -D --defined-only "$work/example/libinverse_sqrt.so" | awk '{print $3}' | grep kiln_ | sort | tr '\n' ' ')
[ "$exported" = "kiln_plugin_abi kiln_plugin_get " ] || { echo "exports: $exported"; exit 1; }
# kiln_add_plugin links libm (the example calls sqrt and does not link it itself), so the library
# loads in any process, not only in one that has libm loaded already.
readelf -d "$work/example/libinverse_sqrt.so" | grep -q 'NEEDED.*\[libm\.so' ||
  { echo "libinverse_sqrt.so does not name libm:"; readelf -d "$work/example/libinverse_sqrt.so"; exit 1; }

# The C++ optimizer: the installed SDK plus LibTorch.
cmake -S "$src/examples/optimizer_cpp" -B "$work/signum" -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure-signum.log" 2>&1 ||
  { tail -30 "$work/configure-signum.log"; exit 1; }
cmake --build "$work/signum" >"$work/build-signum.log" 2>&1 || { tail -30 "$work/build-signum.log"; exit 1; }

# The C++ model (docs/plugin-guide.md section 9 trains with it): the same, a model component.
cmake -S "$src/examples/model_cpp" -B "$work/cnn" -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure-cnn.log" 2>&1 ||
  { tail -30 "$work/configure-cnn.log"; exit 1; }
cmake --build "$work/cnn" >"$work/build-cnn.log" 2>&1 || { tail -30 "$work/build-cnn.log"; exit 1; }

# The installed kiln reads them as docs/plugin-guide.md shows (plugins --plugin-path … describe).
for plugin in example:inverse_sqrt:lr_policy signum:signum:optimizer cnn:small_cnn:model; do
  IFS=: read -r dir name kind <<<"$plugin"
  "$prefix/bin/kiln" plugins --plugin-path "$work/$dir" describe "$name" >"$work/describe.log" 2>&1 ||
    { cat "$work/describe.log"; exit 1; }
  grep -qF "$name ($kind)" "$work/describe.log" || { cat "$work/describe.log"; exit 1; }
done

# And without CMake, from pkg-config's flags.
mkdir -p "$work/pc"
PKG_CONFIG_PATH=$prefix/lib/pkgconfig cc -std=c99 -Wall -Wextra -Werror -shared -fPIC \
  $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags kiln-sdk) \
  "$src/examples/lr_policy_c/inverse_sqrt.c" -lm -o "$work/pc/libinverse_sqrt.so"

# The installed kiln finds its built-in plugins under its prefix and the example in [plugins].
cat >"$work/pipeline.toml" <<TOML
[run]
device = "cpu"
epochs = 1
max_steps = 12
eval = false
checkpoints = false
tensorboard = false
output_dir = "$work/out"
[data]
dataset = "synthetic"
synthetic_train = 768
batch_size = 64
workers = 0
[model]
name = "mlp"
hidden = [32]
[optimizer]
name = "signum"
lr = 0.01
beta = 0.9
[lr_policy]
name = "inverse_sqrt"
offset = 4
[plugins]
paths = ["$work/example", "$work/signum"]
TOML
"$prefix/bin/kiln" run "$work/pipeline.toml" --metrics "$work/metrics.jsonl" >"$work/run.log" 2>&1 ||
  { cat "$work/run.log"; exit 1; }
python3 - "$work/metrics.jsonl" <<'PY'
import json, math, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
assert len(steps) == 12, len(steps)
for r in steps:
    want = 0.01 * min(1.0, math.sqrt(4 / r["step"]))
    assert all(abs(lr - want) < 1e-12 for lr in r["lr"]), (r["step"], r["lr"], want)
first, last = steps[0]["loss"], sum(r["loss"] for r in steps[-3:]) / 3
assert last < first - 0.1, f"signum did not train: loss {first} -> {last}"
print(f"lr follows inverse_sqrt over {len(steps)} steps; signum: loss {first:.3f} -> {last:.3f}")
PY
# The pkg-config build is the same plugin.
sed -i "s|$work/example|$work/pc|" "$work/pipeline.toml"
"$prefix/bin/kiln" validate "$work/pipeline.toml"

# The C API from the installed package alone: the C program of tests/capi built with pkg-config
# (kiln.pc) against the installed header and libkiln, which finds the installed plugins beside
# itself; and the Python binding over the installed libkiln training the same pipeline.
mkdir -p "$work/capi"
cc -std=c99 -Wall -Wextra -Werror "$src/tests/capi/capi_test.c" \
  $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs kiln) -lpthread -lm \
  -o "$work/capi/capi_test"
"$work/capi/capi_test" "$src" "$work/capi/run" "$build/tests/plugins" >"$work/capi.log" 2>&1 || { cat "$work/capi.log"; exit 1; }
KILN_LIBRARY="$prefix/lib/libkiln.so" PYTHONPATH="$src/bindings/python" python3 - "$work/pipeline.toml" <<'PY'
import sys, kiln
with kiln.Session.from_file(sys.argv[1], log_level="warn") as s:
    s.run()
    p = s.progress()
    assert p.state == "finished" and p.step == 12, p
print(f"installed libkiln ({kiln.version()}) trained {sys.argv[1]}: {p.step} steps")
PY
echo "install_example: ok"
