#!/usr/bin/env python3
"""Trains the same small MLP on the same data from the same weights twice: with `kiln run` and
the c_sgd_schedulefree plugin, and in PyTorch with schedulefree.SGDScheduleFree. Every step's
loss, each evaluation (at x, the weights eval_weights gives), the trained weights y, the
checkpoint's state and evaluation weights, and `kiln export`'s file (x) must agree to a
tolerance. A second kiln run stops halfway and resumes from its checkpoint, so the state the
plugin keeps in host tensors (z, lr_max, weight_sum) must survive a resume too.

    python test_against_torch.py --kiln <prefix>/bin/kiln --plugin-dir <folder of libsgd_schedulefree.so>

Needs torch, numpy, safetensors and schedulefree (pip install torch numpy safetensors
schedulefree).
"""
import argparse
import gzip
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import safetensors.torch
import schedulefree
import torch
import torch.nn as nn
import torch.nn.functional as F

# Float32 rounding differs in the last bits (torch's lerp and add fuse multiply-adds, the plugin
# does not): the runs differ by about 1e-7. A wrong interpolation weight, warm-up or average
# weight, or evaluating at y instead of x, differs by 1e-3 or more.
TOLERANCE = 1e-5

SIZE, HIDDEN, TRAIN, TEST, BATCH, EPOCHS = 12, [32], 160, 64, 32, 2
STEPS = EPOCHS * TRAIN // BATCH  # 5 an epoch, an evaluation after each
MEAN, STD = 0.2, 0.3
LR, WEIGHT_DECAY = 0.2, 1e-3
# Not the package's defaults (0.9, 0, 0.0, 2.0), so that an option the plugin ignored shows.
OPTIONS = {"momentum": 0.8, "warmup_steps": 3, "r": 0.5, "weight_lr_power": 1.5}


class Mlp(nn.Module):
    """The kiln `mlp` model: flatten, [linear, relu]..., head, with its parameter names."""

    def __init__(self, inputs, hidden, classes):
        super().__init__()
        self.layers = nn.ModuleList()
        for width in hidden:
            layer = nn.Module()
            layer.linear = nn.Linear(inputs, width)
            self.layers.append(layer)
            inputs = width
        self.head = nn.Linear(inputs, classes)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer.linear(x))
        return self.head(x)


def write_idx(path, array, magic):
    """Fashion-MNIST's file format, which kiln's `fashion-mnist` dataset reads."""
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in array.shape:
            f.write(struct.pack(">I", d))
        f.write(array.astype(np.uint8).tobytes())


def make_data(folder):
    """A learnable dataset (a brightness pattern per class, plus noise) and the initial weights;
    both splits as Kiln feeds them (scaled to [0, 1], normalised)."""
    rng = np.random.default_rng(7)
    splits = {}
    for prefix, n in (("train", TRAIN), ("t10k", TEST)):
        labels = rng.integers(0, 10, n)
        base = (np.arange(SIZE * SIZE).reshape(SIZE, SIZE) * 7 % 255)[None]
        pixels = np.clip(base * (labels[:, None, None] + 1) / 10 + rng.integers(0, 60, (n, SIZE, SIZE)),
                         0, 255).astype(np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", pixels, 0x803)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels, 0x801)
        x = (torch.from_numpy(pixels).float().unsqueeze(1) / 255.0 - MEAN) / STD
        splits[prefix] = (x, torch.from_numpy(labels.astype(np.int64)))
    torch.manual_seed(7)
    model = Mlp(SIZE * SIZE, HIDDEN, 10)
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                str(folder / "init.safetensors"))
    return splits


def pipeline(folder, plugin_dir, name):
    """The kiln pipeline: the data in order (no shuffle), one thread, an evaluation after each
    epoch, a checkpoint every 5 steps, the lr constant (the optimizer warms up by itself)."""
    options = "\n".join(f"{k} = {v!r}" for k, v in OPTIONS.items())
    text = f"""
[run]
device = "cpu"
seed = 1
epochs = {EPOCHS}
threads = 1
log_interval = 1
tensorboard = false
checkpoint_every = 5
output_dir = "{folder / name}"
[data]
dataset = "fashion-mnist"
root = "{folder}"
batch_size = {BATCH}
eval_batch_size = {TEST}
workers = 0
shuffle = false
mean = {MEAN}
std = {STD}
[model]
name = "mlp"
hidden = {HIDDEN}
init = "{folder / 'init.safetensors'}"
[optimizer]
name = "c_sgd_schedulefree"
lr = {LR}
weight_decay = {WEIGHT_DECAY}
{options}
[lr_policy]
name = "constant"
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


def evaluate(model, test):
    x, y = test
    with torch.no_grad():
        logits = model(x)
    return F.cross_entropy(logits, y).item(), logits.argmax(1).eq(y).float().mean().item()


def torch_run(folder, splits):
    """The same training with schedulefree.SGDScheduleFree. Kiln evaluates at x and trains on
    from the exact y it kept; the package's train() would recompute y from x (not bit-exact),
    so the twin keeps a copy of y around eval() and puts it back instead."""
    (x_all, y_all), test = splits["train"], splits["t10k"]
    model = Mlp(SIZE * SIZE, HIDDEN, 10)
    model.load_state_dict(safetensors.torch.load_file(str(folder / "init.safetensors")))
    opt = schedulefree.SGDScheduleFree(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY,
                                       **OPTIONS)
    opt.train()
    losses, evals, at_y = [], [], []
    for _ in range(EPOCHS):
        for start in range(0, TRAIN, BATCH):
            opt.zero_grad()
            loss = F.cross_entropy(model(x_all[start:start + BATCH]), y_all[start:start + BATCH])
            loss.backward()
            losses.append(loss.item())
            opt.step()
        y = {k: v.detach().clone() for k, v in model.state_dict().items()}
        at_y.append(evaluate(model, test))
        opt.eval()  # x in the model
        evals.append(evaluate(model, test))
        x = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(y)  # y back, exactly
        for group in opt.param_groups:
            group["train_mode"] = True
    names = {p: n for n, p in model.named_parameters()}
    z = {names[p]: s["z"] for p, s in opt.state.items()}
    group = opt.param_groups[0]
    return {"losses": losses, "evals": evals, "at_y": at_y, "y": y, "x": x, "z": z,
            "lr_max": group["lr_max"], "weight_sum": group["weight_sum"]}


def read_metrics(path):
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return ([r for r in records if r["type"] == "step"],
            [r for r in records if r["type"] == "eval"])


def checkpoint(folder, name):
    """The last checkpoint: y (model.safetensors); x (eval/<name>), z and the scalars
    (optim/<name>/<slot>) from trainer.safetensors."""
    step_dir = folder / name / "version_0" / "checkpoints" / f"step-{STEPS:09d}"
    y = safetensors.torch.load_file(str(step_dir / "model.safetensors"))
    trainer = safetensors.torch.load_file(str(step_dir / "trainer.safetensors"))
    x = {k[len("eval/"):]: v for k, v in trainer.items() if k.startswith("eval/")}
    state = {}
    for key, value in trainer.items():
        if key.startswith("optim/"):
            _, param, slot = key.split("/")
            state.setdefault(slot, {})[param] = value
    return y, x, state


def max_difference(a, b, what):
    assert sorted(a) == sorted(b), f"{what}: names differ: {sorted(a)} vs {sorted(b)}"
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", required=True, help="the kiln executable")
    ap.add_argument("--plugin-dir", required=True, help="folder holding libsgd_schedulefree.so")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="schedulefree-vs-torch-") as tmp:
        folder = Path(tmp)
        splits = make_data(folder)
        plugin_dir = Path(args.plugin_dir).resolve()
        # Straight through (with its metrics, then exported); then 5 steps, and a resume from
        # that checkpoint to the end.
        kiln(args, "run", pipeline(folder, plugin_dir, "straight"), "--metrics",
             folder / "straight.jsonl")
        kiln(args, "export", folder / "straight", "--to", folder / "exported.safetensors")
        resumed = pipeline(folder, plugin_dir, "resumed")
        kiln(args, "run", resumed, "--set", "run.max_steps=5")
        kiln(args, "run", resumed, "--resume", "auto")
        want = torch_run(folder, splits)

        steps, evals = read_metrics(folder / "straight.jsonl")
        assert len(steps) == STEPS, f"{len(steps)} step records, expected {STEPS}"
        assert len(evals) == EPOCHS, f"{len(evals)} evaluations, expected {EPOCHS}"
        dl = max(relative(r["loss"], e) for r, e in zip(steps, want["losses"]))
        de = max(relative(r["loss"], e[0]) for r, e in zip(evals, want["evals"]))
        da = max(abs(r["accuracy"] - e[1]) for r, e in zip(evals, want["evals"]))
        # The evaluation is at x: at y it would have measured another loss.
        dy = min(relative(a[0], e[0]) for a, e in zip(want["at_y"], want["evals"]))
        print(f"metrics: {STEPS} steps, largest relative difference from "
              f"schedulefree.SGDScheduleFree: step loss {dl:.2e}, evaluation loss {de:.2e} "
              f"(at y it would differ by {dy:.2e}), accuracy {da:g} (tolerance {TOLERANCE:g})")
        assert dl < TOLERANCE and de < TOLERANCE and da == 0, "the losses differ from torch"
        assert dy > 100 * TOLERANCE, f"x and y evaluate alike ({dy:.2e}): the check proves nothing"

        exported = safetensors.torch.load_file(str(folder / "exported.safetensors"))
        dx = max_difference(exported, want["x"], "kiln export")
        print(f"kiln export: the evaluation weights x, largest difference {dx:.2e}")
        assert dx < TOLERANCE, "kiln export's weights are not x"
        for name in ("straight", "resumed"):
            y, x, state = checkpoint(folder, name)
            dw = max_difference(y, want["y"], "weights y")
            dx = max_difference(x, want["x"], "evaluation weights x")
            dz = max_difference(state["z"], want["z"], "state 'z'")
            # A group's scalars live with its first parameter: one pair per group (Kiln's mlp
            # has two, weights and biases; the package's one group advances alike).
            assert len(state["lr_max"]) == len(state["weight_sum"]) == 2, sorted(state["lr_max"])
            ds = max([relative(v.item(), want["lr_max"]) for v in state["lr_max"].values()] +
                     [relative(v.item(), want["weight_sum"]) for v in state["weight_sum"].values()])
            print(f"{name}: {STEPS} steps, largest difference from schedulefree.SGDScheduleFree: "
                  f"y {dw:.2e}, x {dx:.2e}, z {dz:.2e}, lr_max and weight_sum {ds:.1e} "
                  f"(tolerance {TOLERANCE:g})")
            assert max(dw, dx, dz, ds) < TOLERANCE, f"{name}: differs from torch"
        moved = max_difference(want["x"], want["y"], "weights")
        assert moved > 100 * TOLERANCE, f"x barely differs from y ({moved:.2e})"


if __name__ == "__main__":
    main()
