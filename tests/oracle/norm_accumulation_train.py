"""Oracle for norm.running_stats_update in training: a PyTorch loop with gradient accumulation
that moves batch norm's running statistics by hand, as each mode says.

Phase "prepare" writes a small IDX dataset (Fashion-MNIST's file names and format) and the
initial weights of a twin of the kiln mlp plugin with norm layers (flatten, [linear,
BatchNorm1d, relu]..., head) as safetensors, named as Kiln names them.
Phase "train" trains the twin on one process: SGD with momentum, batches in order (no shuffle),
windows of `accumulation` micro-batches (the epoch's last window shorter), each micro-batch's
loss divided by its window's length. Two ranks of syncbn under DDP normalise and step as this
process does on their samples together, so the same loop is the oracle for both. The running
statistics move per `mode`:
  micro_batch        BatchNorm at its momentum m on every micro-batch (PyTorch's behaviour);
  adjusted_momentum  BatchNorm at 1 - (1 - m) ** (1 / k) on every micro-batch of a window of k;
  pooled_window      not during the window (momentum 0); after it, one update at m from
                     torch.nn.functional.batch_norm over the window's inputs to the layer,
                     concatenated: what one batch of the whole window would give.
Writes the final weights and buffers to oracle.safetensors.
Phase "compare" writes to diffs.json, for each pair [a, b] of safetensors files, the largest
absolute difference of the running statistics and of the other tensors.
"""
import gzip
import json
import os
import struct

import numpy as np
import safetensors.torch
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Scratch


class Mlp(nn.Module):
    def __init__(self, inputs, hidden, classes, momentum):
        super().__init__()
        self.layers = nn.ModuleList()
        for width in hidden:
            layer = nn.Module()
            layer.linear = nn.Linear(inputs, width)
            layer.norm = nn.BatchNorm1d(width, eps=1e-5, momentum=momentum)
            self.layers.append(layer)
            inputs = width
        self.head = nn.Linear(inputs, classes)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer.norm(layer.linear(x)))
        return self.head(x)


def state(model):
    return {k: v.contiguous() for k, v in model.state_dict().items()
            if not k.endswith("num_batches_tracked")}


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


def prepare(s, cfg):
    rng = np.random.default_rng(cfg["seed"])
    size = cfg["size"]
    for prefix, n in (("train", cfg["train"]), ("t10k", cfg["test"])):
        labels = rng.integers(0, 10, n)
        base = (np.arange(size * size).reshape(size, size) * 7 % 255)[None]
        # Brightness that drifts over the set, so that consecutive batches differ in their
        # statistics as a shuffled real set's do.
        drift = np.linspace(0, 80, n)[:, None, None]
        images = (base * (labels[:, None, None] + 1) / 10 + rng.integers(0, 60, (n, size, size))
                  + drift)
        write_idx(os.path.join(s.dir, f"{prefix}-images-idx3-ubyte.gz"), np.clip(images, 0, 255),
                  0x803)
        write_idx(os.path.join(s.dir, f"{prefix}-labels-idx1-ubyte.gz"), labels, 0x801)
    torch.manual_seed(cfg["seed"])
    model = Mlp(size * size, cfg["hidden"], 10, 0.1)
    safetensors.torch.save_file(state(model), os.path.join(s.dir, "init.safetensors"))


def train(s, cfg):
    torch.set_num_threads(1)
    images = torch.from_numpy(load_idx(os.path.join(s.dir, "train-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(
        load_idx(os.path.join(s.dir, "train-labels-idx1-ubyte.gz")).astype(np.int64))
    x_all = ((images.float().unsqueeze(1) / 255.0) - cfg["mean"]) / cfg["std"]
    m, mode, k, batch = cfg["norm_momentum"], cfg["mode"], cfg["accumulation"], cfg["batch"]
    model = Mlp(cfg["size"] ** 2, cfg["hidden"], 10, m)
    model.load_state_dict(safetensors.torch.load_file(os.path.join(s.dir, "init.safetensors")),
                          strict=False)
    norms = [layer.norm for layer in model.layers]
    inputs = {id(bn): [] for bn in norms}
    for bn in norms:
        bn.register_forward_hook(lambda mod, args, out: inputs[id(mod)].append(args[0].detach()))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    batches = x_all.shape[0] // batch
    windows = [k] * (batches // k) + ([batches % k] if batches % k else [])
    position = 0
    for window in windows:
        opt.zero_grad()
        for bn in norms:
            bn.momentum = {"micro_batch": m, "adjusted_momentum": 1 - (1 - m) ** (1 / window),
                           "pooled_window": 0.0}[mode]
            inputs[id(bn)].clear()
        for _ in range(window):
            idx = slice(position, position + batch)
            position += batch
            loss = F.cross_entropy(model(x_all[idx]), labels[idx]) / window
            loss.backward()
        if mode == "pooled_window":
            with torch.no_grad():
                for bn in norms:
                    F.batch_norm(torch.cat(inputs[id(bn)]), bn.running_mean, bn.running_var,
                                 training=True, momentum=m)
        opt.step()
    safetensors.torch.save_file(state(model), os.path.join(s.dir, "oracle.safetensors"))


def compare(s, cfg):
    out = []
    for a_path, b_path in cfg["pairs"]:
        a = safetensors.torch.load_file(a_path)
        b = safetensors.torch.load_file(b_path)
        assert sorted(a) == sorted(b), (sorted(a), sorted(b))

        def diff(keys):
            return max(((a[k].double() - b[k].double()).abs().max().item() for k in keys),
                       default=0.0)

        stats = [k for k in a if k.endswith(("running_mean", "running_var"))]
        out.append({"stats": diff(stats), "weights": diff([k for k in a if k not in stats])})
    (s.dir / "diffs.json").write_text(json.dumps(out))


def main():
    s = Scratch()
    cfg = s.config
    {"prepare": prepare, "train": train, "compare": compare}[cfg["phase"]](s, cfg)


if __name__ == "__main__":
    main()
