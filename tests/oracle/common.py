"""Shared helpers of the oracle scripts: a scratch directory of raw float arrays + config.json,
the IDX files Kiln's fashion_mnist dataset reads, and the twin of the kiln mlp plugin."""
import gzip
import json
import os
import pathlib
import struct
import sys

import numpy as np
import safetensors.torch
import torch
import torch.nn as nn
import torch.nn.functional as F


class Scratch:
    def __init__(self):
        self.dir = pathlib.Path(sys.argv[1])
        self.config = json.loads((self.dir / "config.json").read_text())

    def load(self, name, shape, dtype=np.float32):
        array = np.fromfile(self.dir / name, dtype=dtype).reshape(shape)
        return torch.from_numpy(array.copy())

    def save(self, name, tensor, dtype=np.float32):
        tensor.detach().cpu().contiguous().numpy().astype(dtype).tofile(self.dir / name)


def write_idx(path, array, magic):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in array.shape:
            f.write(struct.pack(">I", d))
        f.write(array.astype(np.uint8).tobytes())


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    return np.frombuffer(data[4 + 4 * len(dims):], dtype=np.uint8).reshape(dims)


def write_pattern_set(directory, cfg, noise, classes=10, drift=0.0):
    """Fashion-MNIST's file names (train, t10k) holding a learnable set: a per-class brightness
    pattern plus uniform noise below `noise`, plus a brightness rising by `drift` over the set
    (consecutive batches then differ in their statistics as a shuffled real set's do)."""
    rng = np.random.default_rng(cfg["seed"])
    size = cfg["size"]
    for prefix, n in (("train", cfg["train"]), ("t10k", cfg["test"])):
        labels = rng.integers(0, classes, n)
        base = (np.arange(size * size).reshape(size, size) * 7 % 255)[None]
        images = base * (labels[:, None, None] + 1) / 10 + rng.integers(0, noise, (n, size, size))
        if drift:
            images = images + np.linspace(0, drift, n)[:, None, None]
        write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"),
                  np.clip(images, 0, 255), 0x803)
        write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), labels, 0x801)


def load_split(directory, prefix, mean, std):
    """A split as Kiln feeds it: images scaled to [0, 1], normalised, N×1×H×W; int64 labels."""
    images = torch.from_numpy(
        load_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(
        load_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64))
    return ((images.float().unsqueeze(1) / 255.0) - mean) / std, labels


def save_state(model, path):
    """The model's weights as safetensors, without batch norm's step counters (Kiln keeps none)."""
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    safetensors.torch.save_file(state, path)


def max_difference(a, b, keys):
    return max(((a[k].double() - b[k].double()).abs().max().item() for k in keys), default=0.0)


class Mlp(nn.Module):
    """The kiln mlp plugin: flatten, [linear, (batch norm,) relu]..., head; Kiln's names."""

    def __init__(self, inputs, hidden, classes, norm_momentum=None):
        super().__init__()
        self.layers = nn.ModuleList()
        for width in hidden:
            layer = nn.Module()
            layer.linear = nn.Linear(inputs, width)
            if norm_momentum is not None:
                layer.norm = nn.BatchNorm1d(width, eps=1e-5, momentum=norm_momentum)
            self.layers.append(layer)
            inputs = width
        self.head = nn.Linear(inputs, classes)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = layer.linear(x)
            if hasattr(layer, "norm"):
                x = layer.norm(x)
            x = F.relu(x)
        return self.head(x)


def read_metrics(path):
    """A `kiln run --metrics` file as its step records and its eval records, in order."""
    steps, evals = [], []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            (steps if record["type"] == "step" else evals).append(record)
    return steps, evals
