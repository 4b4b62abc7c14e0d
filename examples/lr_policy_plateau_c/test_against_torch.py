#!/usr/bin/env python3
"""Trains a small MLP on synthetic data with `kiln run` and the c_plateau policy watching the
top-1 accuracy (mode max), an evaluation after every epoch, and replays the run's own
evaluations into
torch.optim.lr_scheduler.ReduceLROnPlateau (the same mode, factor, patience, relative threshold
and floor; no cooldown, eps 0): the rate of every step must equal torch's after the evaluations
before it, exactly, and the policy must have lowered it at least twice. A second run stops
halfway and resumes from its checkpoint: its rates and final weights must equal the first's,
so the policy's state (get_state / set_state) survives a resume.

    python test_against_torch.py --kiln <prefix>/bin/kiln --plugin-dir <folder of libplateau.so>

Needs torch and safetensors (pip install torch safetensors).
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import safetensors.torch
import torch

LR, FACTOR, PATIENCE, THRESHOLD, MIN_LR = 0.05, 0.5, 0, 1e-4, 0.004
EPOCHS, STEPS_PER_EPOCH = 6, 8


def pipeline(folder, plugin_dir, name):
    text = f"""[run]
device = "cpu"
seed = 1
epochs = {EPOCHS}
threads = 1
log_interval = 1
tensorboard = false
checkpoint_every = 4
output_dir = "{folder / name}"
[data]
dataset = "synthetic"
synthetic_train = {64 * STEPS_PER_EPOCH}
synthetic_test = 128
batch_size = 64
workers = 0
[model]
name = "mlp"
hidden = [32]
[optimizer]
name = "sgd"
lr = {LR}
momentum = 0.9
[lr_policy]
name = "c_plateau"
metric = "top1"
mode = "max"
factor = {FACTOR}
patience = {PATIENCE}
threshold = {THRESHOLD}
min_lr = {MIN_LR}
[plugins]
paths = ["{plugin_dir}"]
"""
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def kiln(args, *extra):
    done = subprocess.run([args.kiln, *map(str, extra)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"kiln {' '.join(map(str, extra))} failed ({done.returncode}):\n"
                 f"{done.stdout}{done.stderr}")


def records(path):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    steps = {r["step"]: r["lr"][0] for r in lines if r["type"] == "step"}
    evals = [r for r in lines if r["type"] == "eval"]
    return steps, evals


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", required=True, help="the kiln executable")
    ap.add_argument("--plugin-dir", required=True, help="folder holding libplateau.so")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="plateau-vs-torch-") as tmp:
        folder = Path(tmp)
        plugin_dir = Path(args.plugin_dir).resolve()
        kiln(args, "run", pipeline(folder, plugin_dir, "straight"), "--metrics",
             folder / "straight.jsonl")
        resumed = pipeline(folder, plugin_dir, "resumed")
        half = EPOCHS * STEPS_PER_EPOCH // 2 + 4  # past the evaluations of epochs 1 to 3
        kiln(args, "run", resumed, "--set", f"run.max_steps={half}")
        kiln(args, "run", resumed, "--resume", "auto", "--metrics", folder / "resumed.jsonl")

        steps, evals = records(folder / "straight.jsonl")
        assert len(steps) == EPOCHS * STEPS_PER_EPOCH, f"{len(steps)} steps"
        assert len(evals) == EPOCHS, f"{len(evals)} evaluations"
        # torch: the same evaluations, each after its step, the rate read before the next step.
        param = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([param], lr=LR)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, mode="max", factor=FACTOR, patience=PATIENCE, threshold=THRESHOLD,
            threshold_mode="rel", cooldown=0, min_lr=MIN_LR, eps=0.0)
        expected, pending = {}, list(evals)
        for step in sorted(steps):
            while pending and pending[0]["step"] < step:
                scheduler.step(pending.pop(0)["accuracy"])
            expected[step] = opt.param_groups[0]["lr"]
        wrong = [(s, steps[s], expected[s]) for s in steps if steps[s] != expected[s]]
        assert not wrong, f"rates differ from ReduceLROnPlateau (step, kiln, torch): {wrong[:5]}"
        lowered = sum(1 for s in steps if s > 1 and steps[s] < steps[s - 1])
        print(f"{len(steps)} steps, {len(evals)} evaluations: every rate equals "
              f"ReduceLROnPlateau's; lowered {lowered} times")
        assert lowered >= 2, "the policy lowered the rate fewer than twice: nothing was tested"

        again, _ = records(folder / "resumed.jsonl")
        assert again and all(again[s] == steps[s] for s in again), "the resumed run's rates differ"
        last = f"step-{EPOCHS * STEPS_PER_EPOCH:09d}"
        a = safetensors.torch.load_file(
            str(folder / "straight" / "version_0" / "checkpoints" / last / "model.safetensors"))
        b = safetensors.torch.load_file(
            str(folder / "resumed" / "version_0" / "checkpoints" / last / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run's weights differ"
        print(f"resumed after step {half}: {len(again)} more steps at the same rates, the same "
              "final weights")


if __name__ == "__main__":
    main()
