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
import json
import os

import safetensors.torch
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Mlp, Scratch, load_split, read_metrics, save_state, write_pattern_set

CLASSES = 10


class Linear(nn.Module):
    def __init__(self, inputs):
        super().__init__()
        self.fc = nn.Linear(inputs, CLASSES)

    def forward(self, x):
        return self.fc(x.flatten(1))


def prepare(s, cfg):
    write_pattern_set(s.dir, cfg, noise=90, classes=CLASSES)
    torch.manual_seed(cfg["seed"])
    size = cfg["size"]
    for name, model in (("mlp", Mlp(size * size, cfg["hidden"], CLASSES)),
                        ("linear", Linear(size * size))):
        save_state(model, os.path.join(s.dir, f"{name}.safetensors"))


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
    model = (Mlp(size * size, cfg["hidden"], CLASSES) if cfg["model"] == "mlp"
             else Linear(size * size))
    model.load_state_dict(safetensors.torch.load_file(
        os.path.join(s.dir, ("mlp" if cfg["model"] == "mlp" else "linear") + ".safetensors")))
    loss_of = loss_fn(cfg)
    x_all, y_all = load_split(s.dir, "train", cfg["mean"], cfg["std"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    batch = cfg["batch"]
    expected_steps = []
    for start in range(0, x_all.shape[0], batch):
        opt.zero_grad()
        loss, _ = loss_of(model(x_all[start:start + batch]), y_all[start:start + batch])
        loss.backward()
        opt.step()
        expected_steps.append(loss.item())
    x_test, y_test = load_split(s.dir, "t10k", cfg["mean"], cfg["std"])
    with torch.no_grad():
        logits = model(x_test)
        loss, _ = loss_of(logits, y_test)
        top5 = logits.topk(5, dim=1).indices.eq(y_test.view(-1, 1)).any(1).float().mean().item()
        expected_eval = {"accuracy": logits.argmax(1).eq(y_test).float().mean().item(),
                         "top5": top5, "loss": loss.item()}
    steps, evals = read_metrics(cfg["metrics"])
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
