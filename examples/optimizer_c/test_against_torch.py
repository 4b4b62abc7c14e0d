#!/usr/bin/env python3
"""Trains the same small MLP on the same data from the same weights twice: with `kiln run` and
the adagrad plugin, and in PyTorch with torch.optim.Adagrad. The weights and the state "sum" must
agree to a tolerance. A second kiln run stops halfway and resumes from its checkpoint, so the
state the plugin keeps in host tensors must survive a resume too.

    python test_against_torch.py --kiln <prefix>/bin/kiln --plugin-dir <folder of libadagrad.so>

Needs torch, numpy and safetensors (pip install torch numpy safetensors).
"""
import argparse
import gzip
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import torch.nn as nn
import torch.nn.functional as F

# Float32 rounding differs in the last bits (torch fuses some multiply-adds, the plugin does not)
# and 20 steps carry it along: the runs differ by about 1e-7. A wrong step count, weight decay,
# starting sum or a sum lost on resume differs by 4e-3 or more.
TOLERANCE = 1e-5

SIZE, HIDDEN, TRAIN, BATCH, STEPS = 12, [32], 640, 32, 20
MEAN, STD = 0.2, 0.3
OPTIONS = {"lr": 0.05, "weight_decay": 1e-3, "lr_decay": 0.01, "initial_accumulator_value": 0.1,
           "eps": 1e-10}


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
    """The kiln pipeline: the data in order (no shuffle), one thread, checkpoints every 10 steps."""
    options = "\n".join(f"{k} = {v!r}" for k, v in OPTIONS.items())
    text = f"""
[run]
device = "cpu"
seed = 1
epochs = 1
max_steps = {STEPS}
threads = 1
eval = false
tensorboard = false
checkpoint_every = 10
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
name = "c_adagrad"
{options}
[plugins]
paths = ["{plugin_dir}"]
"""
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def kiln(args, *extra):
    done = subprocess.run([args.kiln, *extra], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"kiln {' '.join(map(str, extra))} failed ({done.returncode}):\n"
                 f"{done.stdout}{done.stderr}")


def torch_run(folder, train):
    """The same training in PyTorch: torch.optim.Adagrad on the same batches."""
    pixels, labels = train
    x_all = (torch.from_numpy(pixels).float().unsqueeze(1) / 255.0 - MEAN) / STD
    y_all = torch.from_numpy(labels.astype(np.int64))
    model = Mlp(SIZE * SIZE, HIDDEN, 10)
    model.load_state_dict(safetensors.torch.load_file(str(folder / "init.safetensors")))
    opt = torch.optim.Adagrad(model.parameters(), **OPTIONS)
    for step in range(STEPS):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        opt.zero_grad()
        F.cross_entropy(model(x_all[batch]), y_all[batch]).backward()
        opt.step()
    names = {p: n for n, p in model.named_parameters()}
    sums = {names[p]: s["sum"] for p, s in opt.state.items()}
    return model.state_dict(), sums


def checkpoint(folder, name):
    # The run writes into a run folder of its own under its output folder (version_0 for a
    # fresh one; the resumed run continues in it).
    step_dir = folder / name / "version_0" / "checkpoints" / f"step-{STEPS:09d}"
    weights = safetensors.torch.load_file(str(step_dir / "model.safetensors"))
    trainer = safetensors.torch.load_file(str(step_dir / "trainer.safetensors"))
    return weights, {k.split("/")[1]: v for k, v in trainer.items()
                     if k.startswith("optim/") and k.endswith("/sum")}


def max_difference(a, b, what):
    assert sorted(a) == sorted(b), f"{what}: names differ: {sorted(a)} vs {sorted(b)}"
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", required=True, help="the kiln executable")
    ap.add_argument("--plugin-dir", required=True, help="folder holding libadagrad.so")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="adagrad-vs-torch-") as tmp:
        folder = Path(tmp)
        train = make_data(folder)
        plugin_dir = Path(args.plugin_dir).resolve()
        # Straight through; then 10 steps, and a resume from that checkpoint to the end.
        kiln(args, "run", pipeline(folder, plugin_dir, "straight"))
        resumed = pipeline(folder, plugin_dir, "resumed")
        kiln(args, "run", resumed, "--set", "run.max_steps=10")
        kiln(args, "run", resumed, "--resume", "auto")
        want_weights, want_sums = torch_run(folder, train)
        for name in ("straight", "resumed"):
            weights, sums = checkpoint(folder, name)
            dw = max_difference(weights, want_weights, "weights")
            ds = max_difference(sums, want_sums, "state 'sum'")
            print(f"{name}: {STEPS} steps, largest difference from torch.optim.Adagrad: "
                  f"weights {dw:.2e}, sum {ds:.2e} (tolerance {TOLERANCE:g})")
            assert dw < TOLERANCE and ds < TOLERANCE, f"{name}: differs from torch"
        moved = max_difference(want_weights, safetensors.torch.load_file(
            str(folder / "init.safetensors")), "weights")
        assert moved > 100 * TOLERANCE, f"training barely moved the weights ({moved:.2e})"


if __name__ == "__main__":
    main()
