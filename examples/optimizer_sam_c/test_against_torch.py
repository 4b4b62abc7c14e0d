#!/usr/bin/env python3
"""Trains the same small MLP on the same data from the same weights twice: with `kiln run` and
the c_sam plugin around Kiln's sgd ([optimizer.inner]), and in PyTorch with
pytorch_optimizer.SAM(base_optimizer=torch.optim.SGD) stepped with a closure over the same
batch. Every step's loss (at the weights before the step), the final weights and the inner
optimizer's momentum (checkpointed as "inner.momentum_buffer") must agree to a tolerance, and
every step must have evaluated the model once more (the metrics' "reevaluations": 1). A second
kiln run stops halfway and resumes from its checkpoint, so the inner optimizer's state must
survive a resume too.

    python test_against_torch.py --kiln <prefix>/bin/kiln --plugin-dir <folder of libsam.so>

Needs torch, numpy, safetensors and pytorch-optimizer (pip install torch numpy safetensors
pytorch-optimizer).
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
import pytorch_optimizer
import safetensors.torch
import torch
import torch.nn as nn
import torch.nn.functional as F

# Float32 sums in another order (the gradient norm) and torch's fused multiply-adds: the runs
# differ by about 1e-7. A step without the ascent, a wrong radius, an ascent left in the weights
# or gradients taken at w instead of w + e(w) differ by 1e-4 or more.
TOLERANCE = 1e-5

SIZE, HIDDEN, TRAIN, BATCH = 12, [32], 320, 32
STEPS = TRAIN // BATCH  # one epoch
MEAN, STD = 0.2, 0.3
LR, WEIGHT_DECAY, RHO, MOMENTUM = 0.1, 1e-3, 0.1, 0.9


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
    """A learnable dataset (a brightness pattern per class, plus noise) and the initial weights."""
    rng = np.random.default_rng(7)
    images = {}
    for prefix, n in (("train", TRAIN), ("t10k", 64)):
        labels = rng.integers(0, 10, n)
        base = (np.arange(SIZE * SIZE).reshape(SIZE, SIZE) * 7 % 255)[None]
        pixels = np.clip(base * (labels[:, None, None] + 1) / 10 + rng.integers(0, 60, (n, SIZE, SIZE)),
                         0, 255).astype(np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", pixels, 0x803)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels, 0x801)
        images[prefix] = (pixels, labels)
    torch.manual_seed(7)
    model = Mlp(SIZE * SIZE, HIDDEN, 10)
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                str(folder / "init.safetensors"))
    return images["train"]


def pipeline(folder, plugin_dir, name):
    """The kiln pipeline: the data in order (no shuffle), one thread, every step in the metrics,
    checkpoints every 5 steps. lr and weight_decay reach the inner optimizer with each group."""
    text = f"""
[run]
device = "cpu"
seed = 1
epochs = 1
threads = 1
eval = false
log_interval = 1
tensorboard = false
checkpoint_every = 5
output_dir = "{folder / name}"
[data]
dataset = "fashion-mnist"
root = "{folder}"
batch_size = {BATCH}
workers = 0
shuffle = false
mean = {MEAN}
std = {STD}
[model]
name = "mlp"
hidden = {HIDDEN}
init = "{folder / 'init.safetensors'}"
[optimizer]
name = "c_sam"
lr = {LR}
weight_decay = {WEIGHT_DECAY}
rho = {RHO}
[optimizer.inner]
name = "sgd"
momentum = {MOMENTUM}
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


def torch_run(folder, train):
    """The same training with pytorch_optimizer.SAM over torch.optim.SGD, the closure computing
    the loss and gradients again on the same batch."""
    pixels, labels = train
    x_all = (torch.from_numpy(pixels).float().unsqueeze(1) / 255.0 - MEAN) / STD
    y_all = torch.from_numpy(labels.astype(np.int64))
    model = Mlp(SIZE * SIZE, HIDDEN, 10)
    model.load_state_dict(safetensors.torch.load_file(str(folder / "init.safetensors")))
    opt = pytorch_optimizer.SAM(model.parameters(), base_optimizer=torch.optim.SGD, rho=RHO,
                                lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(STEPS):
        x, y = x_all[step * BATCH:(step + 1) * BATCH], y_all[step * BATCH:(step + 1) * BATCH]

        def closure():
            again = F.cross_entropy(model(x), y)
            again.backward()
            return again

        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        losses.append(loss.item())
        opt.step(closure)
    names = {p: n for n, p in model.named_parameters()}
    momentum = {names[p]: s["momentum_buffer"] for p, s in opt.state.items()}
    return losses, model.state_dict(), momentum


def checkpoint(folder, name):
    """The last checkpoint: the weights, and the inner optimizer's state (optim/<name>/inner.*)."""
    step_dir = folder / name / "version_0" / "checkpoints" / f"step-{STEPS:09d}"
    weights = safetensors.torch.load_file(str(step_dir / "model.safetensors"))
    trainer = safetensors.torch.load_file(str(step_dir / "trainer.safetensors"))
    return weights, {k.split("/")[1]: v for k, v in trainer.items()
                     if k.startswith("optim/") and k.endswith("/inner.momentum_buffer")}


def max_difference(a, b, what):
    assert sorted(a) == sorted(b), f"{what}: names differ: {sorted(a)} vs {sorted(b)}"
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", required=True, help="the kiln executable")
    ap.add_argument("--plugin-dir", required=True, help="folder holding libsam.so")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="sam-vs-torch-") as tmp:
        folder = Path(tmp)
        train = make_data(folder)
        plugin_dir = Path(args.plugin_dir).resolve()
        # Straight through (with its metrics); then 5 steps, and a resume from that checkpoint.
        kiln(args, "run", pipeline(folder, plugin_dir, "straight"), "--metrics",
             folder / "straight.jsonl")
        resumed = pipeline(folder, plugin_dir, "resumed")
        kiln(args, "run", resumed, "--set", "run.max_steps=5")
        kiln(args, "run", resumed, "--resume", "auto")
        want_losses, want_weights, want_momentum = torch_run(folder, train)

        steps = [r for r in map(json.loads, (folder / "straight.jsonl").read_text().splitlines())
                 if r["type"] == "step"]
        assert len(steps) == STEPS, f"{len(steps)} step records, expected {STEPS}"
        counted = [r.get("reevaluations") for r in steps]
        assert counted == [1] * STEPS, f"reevaluations per step: {counted}, expected 1 each"
        dl = max(abs(r["loss"] - e) / abs(e) for r, e in zip(steps, want_losses))
        print(f"metrics: {STEPS} steps, one re-evaluation each; largest relative difference of "
              f"the step loss from pytorch_optimizer.SAM: {dl:.2e} (tolerance {TOLERANCE:g})")
        assert dl < TOLERANCE, "the step losses differ from torch"
        for name in ("straight", "resumed"):
            weights, momentum = checkpoint(folder, name)
            dw = max_difference(weights, want_weights, "weights")
            dm = max_difference(momentum, want_momentum, "state 'inner.momentum_buffer'")
            print(f"{name}: {STEPS} steps, largest difference from pytorch_optimizer.SAM: "
                  f"weights {dw:.2e}, inner.momentum_buffer {dm:.2e} (tolerance {TOLERANCE:g})")
            assert dw < TOLERANCE and dm < TOLERANCE, f"{name}: differs from torch"
        moved = max_difference(want_weights, safetensors.torch.load_file(
            str(folder / "init.safetensors")), "weights")
        assert moved > 100 * TOLERANCE, f"training barely moved the weights ({moved:.2e})"


if __name__ == "__main__":
    main()
