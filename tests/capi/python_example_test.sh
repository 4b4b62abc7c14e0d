#!/usr/bin/env bash
# Runs bindings/python/examples/train_quickstart.py on a small synthetic set through libkiln:
#  1. to the end (unreachable target): test accuracy must rise from epoch 1 to the best epoch;
#  2. with an easy target: it must stop early, before the last epoch.
# Usage: tests/capi/python_example_test.sh <python> <libkiln.so> <source_dir>
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 <python> <libkiln.so> <source_dir>" >&2
  exit 2
fi
PY=$1
LIB=$2
SRC=$3
EXAMPLE="$SRC/bindings/python/examples/train_quickstart.py"
[[ -f "$LIB" ]] || { echo "FAIL: no libkiln at $LIB" >&2; exit 1; }
[[ -f "$EXAMPLE" ]] || { echo "FAIL: no example at $EXAMPLE" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln_pyexample.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

EPOCHS=5
# 1024 samples in batches of 64: 16 steps an epoch, a few seconds in all on 2 cores.
COMMON=(
  --set run.device='"cpu"'
  --set run.epochs=$EPOCHS
  --set run.checkpoints=false
  --set run.tensorboard=false
  --set run.output_dir="\"$TMP/out\""
  --set data.dataset='"synthetic"'
  --set data.synthetic_train=1024
  --set data.synthetic_test=512
  --set data.batch_size=64
  --set data.workers=1
  --set lr_policy.warmup_iters=10
  --set 'lr_policy.steps=[60]'
)

run_example() {  # <log> <args...>: runs the example, fails the test when it fails
  local log=$1
  shift
  local rc=0
  KILN_LIBRARY="$LIB" "$PY" "$EXAMPLE" "${COMMON[@]}" "$@" >"$log" 2>"$log.err" || rc=$?
  cat "$log"
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: train_quickstart.py exited with $rc; stderr:" >&2
    cat "$log.err" >&2
    exit 1
  fi
}

# ---- 1: the whole run ----------------------------------------------------------------------------
run_example "$TMP/full.log" --target 1.01 --patience $EPOCHS --metrics "$TMP/full.jsonl"
"$PY" - "$TMP/full.log" "$TMP/full.jsonl" "$EPOCHS" <<'EOF'
import json, re, sys
log, metrics, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(log).read()
rows = re.findall(r"^epoch (\d+)/(\d+)  test accuracy ([0-9.]+)  loss ([0-9.]+)  (\d+) steps  "
                  r"([0-9]+) samples/s$", text, re.M)
def fail(msg):
    sys.exit(f"FAIL: {msg}\n--- output ---\n{text}")
if len(rows) != epochs:
    fail(f"expected {epochs} epoch lines, found {len(rows)}")
if [int(r[0]) for r in rows] != list(range(1, epochs + 1)):
    fail("epoch lines out of order")
acc = [float(r[2]) for r in rows]
if any(int(r[4]) != 16 for r in rows):
    fail("each epoch should report 16 steps")
if any(float(r[5]) <= 0 for r in rows):
    fail("throughput must be positive")
best = max(acc)
if not best >= acc[0] + 0.05:
    fail(f"test accuracy did not rise: first epoch {acc[0]}, best {best}")
if best < 0.5:
    fail(f"best test accuracy {best} is too low for the synthetic set: training is not working")
if not re.search(r"^finished: %d epochs, %d steps, best accuracy %.4f" % (epochs, 16 * epochs, best),
                 text, re.M):
    fail("no matching 'finished:' line")
# The metrics file holds every step and one evaluation per epoch, the same figures as printed.
recs = [json.loads(l) for l in open(metrics) if l.strip()]
evals = [r for r in recs if r["type"] == "eval"]
if sum(r["type"] == "step" for r in recs) != 16 * epochs or len(evals) != epochs:
    fail(f"metrics file: {len(recs)} records, {len(evals)} evals")
if [round(r["accuracy"], 4) for r in evals] != acc:
    fail(f"metrics file accuracies {[r['accuracy'] for r in evals]} differ from the output {acc}")
print(f"ok: accuracy rose from {acc[0]:.4f} (epoch 1) to {best:.4f} (epoch {acc.index(best) + 1})")
EOF

# ---- 2: an easy target stops it early ------------------------------------------------------------
# The first run tells what "easy" is: halfway from epoch 1's accuracy to the best one reached
# before the last epoch (a margin on both sides, should the run not repeat bit for bit).
TARGET=$("$PY" - "$TMP/full.log" "$EPOCHS" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
acc = [float(a) for a in re.findall(r"^epoch \d+/\d+  test accuracy ([0-9.]+)", text, re.M)]
best = max(acc[:int(sys.argv[2]) - 1])
if best <= acc[0] + 0.02:
    sys.exit(f"FAIL: no epoch before the last one clearly beat the first ({acc}); "
             "cannot pick an early target")
print(f"{(acc[0] + best) / 2:.4f}")
EOF
)
run_example "$TMP/early.log" --target "$TARGET" --patience $EPOCHS
"$PY" - "$TMP/early.log" "$EPOCHS" "$TARGET" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
epochs, target = int(sys.argv[2]), float(sys.argv[3])
m = re.search(r"^stopped early at epoch (\d+): accuracy ([0-9.]+) >= target ([0-9.]+)$", text, re.M)
if not m:
    sys.exit(f"FAIL: no 'stopped early' line\n--- output ---\n{text}")
e, a = int(m.group(1)), float(m.group(2))
rows = re.findall(r"^epoch (\d+)/", text, re.M)
if not (1 <= e < epochs) or len(rows) != e:
    sys.exit(f"FAIL: stopped at epoch {e} with {len(rows)} epoch lines; expected before {epochs}\n{text}")
if a < target:
    sys.exit(f"FAIL: stopped at accuracy {a} below the target {target}")
print(f"ok: stopped early at epoch {e} of {epochs} (accuracy {a:.4f} >= {target})")
EOF
echo "PASS"
