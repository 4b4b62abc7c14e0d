#!/usr/bin/env bash
# Plugins built against frozen headers of an earlier ABI load into the current host and train:
# the host reports their ABI as that one and reads only the fields their struct_size covers.
# Usage: frozen_plugins.sh <kiln> <folder of the frozen-header plugins> <their ABI, e.g. 1.0>
set -euo pipefail
kiln=$1
dir=$2
abi=$3
work=$(mktemp -d /tmp/kiln-frozen.XXXXXX)
trap 'rm -rf "$work"' EXIT
for name in c_sgd inverse_sqrt; do
  out=$("$kiln" plugins --plugin-path "$dir" describe "$name" 2>&1) || { echo "$out"; exit 1; }
  echo "$out" | grep -q "abi $abi\b" || { echo "$name: not reported as ABI $abi:"; echo "$out"; exit 1; }
done
cat >"$work/p.toml" <<TOML
[run]
device = "cpu"
epochs = 1
max_steps = 8
eval = false
checkpoints = false
tensorboard = false
output_dir = "$work/out"
[data]
dataset = "synthetic"
synthetic_train = 512
batch_size = 64
workers = 0
[model]
name = "mlp"
hidden = [32]
[optimizer]
name = "c_sgd"
lr = 0.2
[lr_policy]
name = "inverse_sqrt"
offset = 2
[plugins]
paths = ["$dir"]
TOML
"$kiln" run "$work/p.toml" --metrics "$work/m.jsonl" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
python3 - "$work/m.jsonl" "$abi" <<'PY'
import json, math, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
assert len(steps) == 8, len(steps)
for r in steps:
    want = 0.2 * min(1.0, math.sqrt(2 / r["step"]))
    assert all(abs(lr - want) < 1e-12 for lr in r["lr"]), (r["step"], r["lr"], want)
assert steps[-1]["loss"] < steps[0]["loss"], "did not train"
print("ABI", sys.argv[2], "plugins loaded and trained 8 steps")
PY
