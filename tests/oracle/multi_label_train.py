"""Oracle for multi-label data through `kiln run`: a PyTorch loop over the same `tensors` files
and initial weights, whose per-step losses and evaluation (loss, mean average precision) it
compares with the run's metrics file.

Phase "prepare" writes, into config["data"] (a folder), train.safetensors and val.safetensors (uint8 gray images N x H x W and
their targets N x C: uint8 0/1, or float32 in [0, 1] for "soft"), where each class adds its own
brightness pattern to the images of the samples that have it, so that the classes are
learnable; and the initial weights of a twin of the kiln mlp plugin (mlp.safetensors).
Phase "compare" trains the twin for one epoch of SGD (batches in order, the last one short) with
F.binary_cross_entropy_with_logits (pos_weight; label smoothing as timm's on the target rows,
t x (1 - s) + s / C), evaluates it on the validation split, and writes to report.json the
largest relative difference of the step losses and of the evaluation loss, the difference of
the mean average precision from torchmetrics' (multilabel_average_precision, average "macro",
targets >= 0.5 as positive), and the counts compared.
"""
import json
import os

import safetensors.torch
import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import multilabel_average_precision

from common import Mlp, Scratch, read_metrics, save_state


def images_and_targets(rng, n, cfg):
    size, classes = cfg["size"], cfg["classes"]
    present = torch.rand(n, classes, generator=rng) < 0.4
    patterns = torch.rand(classes, size, size, generator=rng) * 120
    noise = torch.rand(n, size, size, generator=rng) * cfg["noise"]
    images = (present.float() @ patterns.view(classes, -1)).view(n, size, size) + noise
    images = images.clamp(0, 255).to(torch.uint8)
    if cfg.get("soft"):
        # Soft rows: a class present at 0.7 to 1, absent at 0 to 0.3.
        jitter = torch.rand(n, classes, generator=rng) * 0.3
        return images, torch.where(present, 1.0 - jitter, jitter).float()
    return images, present.to(torch.uint8)


def prepare(cfg):
    rng = torch.Generator().manual_seed(cfg["seed"])
    os.makedirs(cfg["data"], exist_ok=True)
    for split, n in (("train", cfg["train"]), ("val", cfg["test"])):
        images, targets = images_and_targets(rng, n, cfg)
        safetensors.torch.save_file({"images": images, "labels": targets},
                                    os.path.join(cfg["data"], f"{split}.safetensors"))
    torch.manual_seed(cfg["seed"])
    size = cfg["size"]
    save_state(Mlp(size * size, cfg["hidden"], cfg["classes"]),
               os.path.join(cfg["data"], "mlp.safetensors"))


def split(name, cfg):
    d = safetensors.torch.load_file(os.path.join(cfg["data"], f"{name}.safetensors"))
    x = (d["images"].float().unsqueeze(1) / 255.0 - cfg["mean"]) / cfg["std"]
    return x, d["labels"].float()


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def compare(s, cfg):
    torch.set_num_threads(1)
    size, classes = cfg["size"], cfg["classes"]
    model = Mlp(size * size, cfg["hidden"], classes)
    model.load_state_dict(safetensors.torch.load_file(os.path.join(cfg["data"], "mlp.safetensors")))
    smoothing = cfg.get("label_smoothing", 0.0)
    pos_weight = torch.tensor(cfg["pos_weight"]) if cfg.get("pos_weight") else None

    def loss_of(logits, rows, reduction="mean"):
        target = rows * (1.0 - smoothing) + smoothing / classes if smoothing else rows
        return F.binary_cross_entropy_with_logits(logits, target, pos_weight=pos_weight,
                                                  reduction=reduction)

    x_all, t_all = split("train", cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    batch = cfg["batch"]
    expected_steps = []
    for start in range(0, x_all.shape[0], batch):
        opt.zero_grad()
        loss = loss_of(model(x_all[start:start + batch]), t_all[start:start + batch])
        loss.backward()
        opt.step()
        expected_steps.append(loss.item())
    x_test, t_test = split("val", cfg)
    with torch.no_grad():
        logits = model(x_test)
        eval_loss = loss_of(logits, t_test).item()
        expected_map = multilabel_average_precision(
            logits, (t_test >= 0.5).long(), num_labels=classes, average="macro").item()
    steps, evals = read_metrics(cfg["metrics"])
    report = {"steps": len(steps), "expected_steps": len(expected_steps), "evals": len(evals),
              "step_loss": max((relative(r["loss"], e) for r, e in zip(steps, expected_steps)),
                               default=1e9),
              "expected_map": expected_map}
    if evals:
        got = evals[-1]
        report["eval_loss"] = relative(got["loss"], eval_loss)
        report["map"] = abs(got.get("map", 1e9) - expected_map)
        report["accuracy_is_null"] = 1 if got["accuracy"] is None and got["top5"] is None else 0
    (s.dir / "report.json").write_text(json.dumps(report))


def main():
    s = Scratch()
    cfg = s.config
    if cfg["phase"] == "prepare":
        prepare(cfg)
    else:
        compare(s, cfg)


if __name__ == "__main__":
    main()
