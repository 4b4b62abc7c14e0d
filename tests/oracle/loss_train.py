"""Oracle for [loss] and a model's own loss in training: a PyTorch loop over the same data and
initial weights as a `kiln run`, whose per-step losses and evaluation (top-1, top-5, loss) it
compares with the run's metrics file.

Phase "prepare" writes a small IDX dataset (Fashion-MNIST's file names, 10 classes) and the
initial weights of two twins as safetensors, named as Kiln names them: the kiln mlp plugin
(flatten, linear, relu, head) in mlp.safetensors and tests/plugins/loss_model.cpp's mse_linear
(flatten, fc) in linear.safetensors.
Phase "compare" trains the twin of config["model"] for one epoch of SGD (batches in order, the
last one short) with config["loss"], evaluates it on the test split, and writes to report.json
the largest relative difference of the step losses and of the evaluation from the metrics file
config["metrics"], and the counts compared.
Losses: cross_entropy = F.cross_entropy(weight, label_smoothing); bce_with_logits = timm's
BinaryCrossEntropy (one-hot off = s / C, on = 1 - s + off) with F.binary_cross_entropy_with_logits;
mse = the mse_linear model's own, mean((logits - one_hot) ** 2). Evaluation's loss is the same
loss over the whole split as one batch.
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

CLASSES = 10


class Mlp(nn.Module):
    def __init__(self, inputs, hidden):
        super().__init__()
        self.layers = nn.ModuleList()
        for width in hidden:
            layer = nn.Module()
            layer.linear = nn.Linear(inputs, width)
            self.layers.append(layer)
            inputs = width
        self.head = nn.Linear(inputs, CLASSES)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer.linear(x))
        return self.head(x)


class Linear(nn.Module):
    def __init__(self, inputs):
        super().__init__()
        self.fc = nn.Linear(inputs, CLASSES)

    def forward(self, x):
        return self.fc(x.flatten(1))


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
        labels = rng.integers(0, CLASSES, n)
        base = (np.arange(size * size).reshape(size, size) * 7 % 255)[None]
        images = base * (labels[:, None, None] + 1) / 10 + rng.integers(0, 90, (n, size, size))
        write_idx(os.path.join(s.dir, f"{prefix}-images-idx3-ubyte.gz"), np.clip(images, 0, 255),
                  0x803)
        write_idx(os.path.join(s.dir, f"{prefix}-labels-idx1-ubyte.gz"), labels, 0x801)
    torch.manual_seed(cfg["seed"])
    for name, model in (("mlp", Mlp(size * size, cfg["hidden"])), ("linear", Linear(size * size))):
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        safetensors.torch.save_file(state, os.path.join(s.dir, f"{name}.safetensors"))


def split(s, prefix, mean, std):
    images = torch.from_numpy(load_idx(os.path.join(s.dir, f"{prefix}-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(
        load_idx(os.path.join(s.dir, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64))
    return ((images.float().unsqueeze(1) / 255.0) - mean) / std, labels


def loss_fn(cfg):
    spec = cfg["loss"]
    name, smoothing = spec["name"], spec.get("label_smoothing", 0.0)
    weight = torch.tensor(spec["class_weights"]) if spec.get("class_weights") else None

    def mean_and_count(logits, y):
        if name == "mse":
            return ((logits - F.one_hot(y, CLASSES).float()) ** 2).mean(), y.shape[0]
        if name == "bce_with_logits":
            off = smoothing / CLASSES
            target = torch.full(logits.shape, off).scatter_(1, y.view(-1, 1), 1.0 - smoothing + off)
            return F.binary_cross_entropy_with_logits(logits, target, weight=weight), logits.numel()
        loss = F.cross_entropy(logits, y, weight=weight, label_smoothing=smoothing)
        return loss, (weight[y].sum().item() if weight is not None else y.shape[0])

    return mean_and_count


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def compare(s, cfg):
    torch.set_num_threads(1)
    size = cfg["size"]
    model = Mlp(size * size, cfg["hidden"]) if cfg["model"] == "mlp" else Linear(size * size)
    model.load_state_dict(safetensors.torch.load_file(
        os.path.join(s.dir, ("mlp" if cfg["model"] == "mlp" else "linear") + ".safetensors")))
    loss_of = loss_fn(cfg)
    x_all, y_all = split(s, "train", cfg["mean"], cfg["std"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    batch = cfg["batch"]
    expected_steps = []
    for start in range(0, x_all.shape[0], batch):
        opt.zero_grad()
        loss, _ = loss_of(model(x_all[start:start + batch]), y_all[start:start + batch])
        loss.backward()
        opt.step()
        expected_steps.append(loss.item())
    x_test, y_test = split(s, "t10k", cfg["mean"], cfg["std"])
    with torch.no_grad():
        logits = model(x_test)
        loss, _ = loss_of(logits, y_test)
        top5 = logits.topk(5, dim=1).indices.eq(y_test.view(-1, 1)).any(1).float().mean().item()
        expected_eval = {"accuracy": logits.argmax(1).eq(y_test).float().mean().item(),
                         "top5": top5, "loss": loss.item()}
    steps, evals = [], []
    for line in open(cfg["metrics"]):
        record = json.loads(line)
        (steps if record["type"] == "step" else evals).append(record)
    report = {"steps": len(steps), "expected_steps": len(expected_steps), "evals": len(evals),
              "step_loss": max((relative(r["loss"], e) for r, e in zip(steps, expected_steps)),
                               default=1e9)}
    if evals:
        got = evals[-1]
        report["eval_loss"] = relative(got["loss"], expected_eval["loss"])
        report["accuracy"] = abs(got["accuracy"] - expected_eval["accuracy"])
        report["top5"] = abs(got["top5"] - expected_eval["top5"])
        report["expected_top5"] = expected_eval["top5"]
    (s.dir / "report.json").write_text(json.dumps(report))


def main():
    s = Scratch()
    cfg = s.config
    {"prepare": prepare, "compare": compare}[cfg["phase"]](s, cfg)


if __name__ == "__main__":
    main()
