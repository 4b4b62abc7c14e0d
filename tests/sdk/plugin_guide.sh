#!/usr/bin/env bash
# Follows docs/plugin-guide.md as a new user would: every block after `<!-- file: F -->` is
# written to F, every block after `<!-- run -->` is run in order (one shell, so `cd` and exports
# carry over), a `<!-- run: fails -->` block must fail, and the `<!-- setup -->` block is replaced
# by this checkout, a temporary prefix and the given Python. A block after
# `<!-- excerpt: FILE -->` must appear in FILE (of the checkout) as it is. Then the run's metrics
# must show the guide's lrs.
# Section 7b builds examples/optimizer_schedulefree_c and examples/optimizer_sam_c and runs their
# tests against schedulefree and pytorch_optimizer (that Python needs both), trains with c_sam,
# and shows `kiln plan` of a [[optimizer.partition]].
# Section 9 builds examples/model_cpp (C++ over the LibTorch of that Python's torch) and trains
# with it.
# Usage: plugin_guide.sh <kiln source dir> <kiln build dir> <python with torch, safetensors,
#        schedulefree and pytorch-optimizer>
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
python=$3
work=$(mktemp -d /tmp/kiln-plugin-guide.XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 - "$src/docs/plugin-guide.md" "$work/steps.sh" "$work" <<'PY'
import re, shlex, sys
guide, out, work = sys.argv[1:]
text = open(guide).read()
blocks = re.findall(r"<!-- (setup|run|run: fails|file: [^ ]+) -->\n```[a-z]*\n(.*?)```", text, re.S)
assert blocks, "no marked blocks in the guide"
# Excerpts quote a file of the checkout: they must not drift from it.
excerpts = re.findall(r"<!-- excerpt: ([^ ]+) -->\n```[a-z]*\n(.*?)```", text, re.S)
src = guide.rsplit("/docs/", 1)[0]
for path, body in excerpts:
    assert body in open(f"{src}/{path}").read(), f"the guide quotes {path}, which no longer has:\n{body}"
lines = ["set -euo pipefail", f"cd {shlex.quote(work)}"]
for i, (marker, body) in enumerate(blocks):
    if marker == "setup":
        continue  # replaced below by the caller's checkout and prefix
    if marker.startswith("file: "):
        path = marker[len("file: "):]
        lines.append(f"mkdir -p \"$(dirname {shlex.quote(path)})\"")
        lines.append(f"cat > {shlex.quote(path)} <<'KILN_GUIDE_EOF'\n{body}KILN_GUIDE_EOF")
    elif marker == "run":
        lines.append(f"echo '--- guide step {i}'")
        lines.append(body)
    else:  # run: fails
        lines.append(f"if out=$( ( {body.strip()} ) 2>&1 ); then echo 'guide step {i} should fail'; exit 1; fi")
        lines.append('echo "$out"')
open(out, "w").write("\n".join(lines) + "\n")
PY

# The setup block's variables, for this checkout and a temporary prefix.
export KILN_SRC=$src PREFIX=$work/prefix PYTHON=$python
# The guide installs from $KILN_SRC/build/release; point that at this build.
if [ "$build" != "$src/build/release" ]; then
  sed -i "s|\"\$KILN_SRC/build/release\"|\"$build\"|" "$work/steps.sh"
fi
bash "$work/steps.sh" >"$work/guide.log" 2>&1 || { tail -40 "$work/guide.log"; exit 1; }
# describe saw the component; the misspelt key was refused with the suggestion the guide shows.
for expected in "linear_decay (lr_policy)" "unknown key; did you mean 'end_factor'?" \
  "c_adagrad (optimizer)" "straight: 20 steps" "resumed: 20 steps" "small_cnn (model)" \
  "activation checkpointing: sqrt (n=3, k=2)" \
  "c_sgd_schedulefree (optimizer)" "evaluation weights (eval_weights)" \
  "kiln export: the evaluation weights x" "straight: 10 steps, largest difference from schedulefree" \
  "resumed: 10 steps, largest difference from schedulefree" "c_sam (optimizer)" \
  "wraps an optimizer" "whole step with re-evaluation (step_all)" "one re-evaluation each" \
  "resumed: 10 steps, largest difference from pytorch_optimizer.SAM" \
  "layers.0.linear.weight 32x784 -> muon (default/muon)" "head.bias 10 -> adamw (bias)"; do
  grep -qF "$expected" "$work/guide.log" || { echo "missing: $expected"; tail -40 "$work/guide.log"; exit 1; }
done
metrics=$(find "$work" -name metrics.jsonl | head -1)
python3 - "$metrics" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
assert len(steps) == 10, len(steps)
for r in steps:
    want = 0.1 * (1 - 0.5 * r["step"] / 10)
    assert all(abs(lr - want) < 1e-12 for lr in r["lr"]), (r["step"], r["lr"], want)
print("the guide's plugin trained 10 steps at the lrs it promises")
PY
# Section 7b's SAM pipeline: 5 steps, each evaluating the model once more.
python3 - "$work/sam.jsonl" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
assert [r["reevaluations"] for r in steps] == [1] * 5, steps
print("the guide's c_sam re-evaluated once in each of its 5 steps")
PY
