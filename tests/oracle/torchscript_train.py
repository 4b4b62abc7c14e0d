"""Oracle for the torchscript model plugin: a model written in Python, trained by Kiln.

Phase "prepare" writes a small IDX dataset (Fashion-MNIST's file names and format) and a small
convolutional network defined here (conv -> BatchNorm2d -> relu -> max pool -> linear, times a
plain buffer) saved with torch.jit.save as net.pt (torch.jit.script) and traced.pt (torch.jit.trace
of the same weights); for the refusals, seven.pt (a scripted net with 7 outputs for 10 classes),
state.pt (torch.save of a state_dict: no TorchScript) and tuple.pt (a forward returning a tuple);
and other.safetensors, other starting weights by the module's own names (for model.init).
Phase "train" trains the eager twin (net.pt's weights, or `init` when given) in PyTorch: SGD with
momentum and weight decay, batches in order (no shuffle), the batch-mean cross entropy; then
evaluates it in eval mode on the test split. Writes result.json: the loss of every step, the
test loss (sum over samples / count) and accuracy, and the final weights to oracle.safetensors.
Phase "compare" writes to diff.json the largest absolute difference between the tensors of two
safetensors files (cfg "a", "b") and the names of "b" that "a" lacks.
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


class Net(nn.Module):
    def __init__(self, size, classes):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.head = nn.Linear(4 * (size // 2) ** 2, classes)
        # A buffer outside any layer: the host must move and cast it with the rest.
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1)) * self.scale


class Pair(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.head = nn.Linear(size * size, 10)

    def forward(self, x):
        y = self.head(torch.flatten(x, 1))
        return y, y


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
        # Learnable: a per-class brightness pattern plus noise.
        base = (np.arange(size * size).reshape(size, size) * 7 % 255)[None]
        images = base * (labels[:, None, None] + 1) / 10 + rng.integers(0, 60, (n, size, size))
        write_idx(os.path.join(s.dir, f"{prefix}-images-idx3-ubyte.gz"), np.clip(images, 0, 255),
                  0x803)
        write_idx(os.path.join(s.dir, f"{prefix}-labels-idx1-ubyte.gz"), labels, 0x801)
    torch.manual_seed(cfg["seed"])
    net = Net(size, 10)
    torch.jit.save(torch.jit.script(net), os.path.join(s.dir, "net.pt"))
    example = torch.zeros(2, 1, size, size)
    torch.jit.save(torch.jit.trace(net, example), os.path.join(s.dir, "traced.pt"))
    torch.jit.save(torch.jit.script(Net(size, 7)), os.path.join(s.dir, "seven.pt"))
    torch.jit.save(torch.jit.script(Pair(size)), os.path.join(s.dir, "tuple.pt"))
    torch.save(net.state_dict(), os.path.join(s.dir, "state.pt"))
    other = Net(size, 10)
    safetensors.torch.save_file({k: v.contiguous() for k, v in other.state_dict().items()},
                                os.path.join(s.dir, "other.safetensors"))


def train(s, cfg):
    torch.set_num_threads(1)
    size = cfg["size"]
    net = Net(size, 10)
    net.load_state_dict(torch.jit.load(os.path.join(s.dir, "net.pt")).state_dict())
    if cfg.get("init"):
        net.load_state_dict(safetensors.torch.load_file(os.path.join(s.dir, cfg["init"])))

    def split(prefix):
        images = torch.from_numpy(
            load_idx(os.path.join(s.dir, f"{prefix}-images-idx3-ubyte.gz")).copy())
        labels = torch.from_numpy(
            load_idx(os.path.join(s.dir, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64))
        x = ((images.float().unsqueeze(1) / 255.0) - cfg["mean"]) / cfg["std"]
        return x, labels

    x, y = split("train")
    opt = torch.optim.SGD(net.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                          weight_decay=cfg["weight_decay"])
    batch = cfg["batch"]
    losses = []
    net.train()
    for step in range(cfg["steps"]):
        first = (step * batch) % x.shape[0]
        opt.zero_grad()
        loss = F.cross_entropy(net(x[first:first + batch]), y[first:first + batch])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    net.eval()
    xt, yt = split("t10k")
    with torch.no_grad():
        logits = net(xt)
        test_loss = F.cross_entropy(logits, yt, reduction="sum").item() / xt.shape[0]
        accuracy = (logits.argmax(1) == yt).sum().item() / xt.shape[0]
    (s.dir / "result.json").write_text(
        json.dumps({"losses": losses, "test_loss": test_loss, "test_accuracy": accuracy}))
    safetensors.torch.save_file({k: v.contiguous() for k, v in net.state_dict().items()},
                                os.path.join(s.dir, "oracle.safetensors"))


def main():
    s = Scratch()
    cfg = s.config
    if cfg["phase"] == "prepare":
        prepare(s, cfg)
    elif cfg["phase"] == "compare":
        a = safetensors.torch.load_file(cfg["a"])
        b = safetensors.torch.load_file(cfg["b"])
        diff = max((a[k].double() - b[k].double()).abs().max().item() for k in b if k in a)
        (s.dir / "diff.json").write_text(
            json.dumps({"max": diff, "missing": sorted(k for k in b if k not in a)}))
    else:
        train(s, cfg)


if __name__ == "__main__":
    main()
