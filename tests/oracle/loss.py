"""Oracle for the host's loss (host/engine/loss.cpp): torch's functional losses on the logits and
targets the C++ test wrote, the value and its gradient w.r.t. the logits, per case.

config.json: {"n": N, "c": C, "cases": [{"name", "loss": "cross_entropy"|"bce_with_logits",
"label_smoothing", "weights": bool, "pos_weight": bool, "soft": bool, "bf16": bool}, ...]}.
Inputs: logits.bin (float32 [N, C]), labels.bin (int64 [N]), soft.bin (float32 [N, C]),
weights.bin, pos_weight.bin (float32 [C]). Writes loss_<i>.bin (float32 [1]) and grad_<i>.bin
(float32 [N, C]) for case i.

cross_entropy: F.cross_entropy(logits, labels or soft, weight, label_smoothing), mean.
bce_with_logits (timm's BinaryCrossEntropy, written out: timm is not a dependency): labels become
one-hot with off = s / C, on = 1 - s + off; soft targets p become p * (1 - s) + s / C, what timm's
Mixup(label_smoothing = s) gives; then F.binary_cross_entropy_with_logits(weight, pos_weight),
mean. bf16: the logits are bfloat16 (as a model's output under autocast), cast to float32 for
the loss under torch.autocast("cpu", bfloat16), the gradient is bfloat16's.
"""
import torch
import torch.nn.functional as F

from common import Scratch

s = Scratch()
cfg = s.config
n, c = cfg["n"], cfg["c"]
logits = s.load("logits.bin", [n, c])
labels = s.load("labels.bin", [n], dtype="int64")
soft = s.load("soft.bin", [n, c])
weights = s.load("weights.bin", [c])
pos_weight = s.load("pos_weight.bin", [c])


def bce_target(target, smoothing):
    if target.dtype == torch.int64:
        off = smoothing / c
        on = 1.0 - smoothing + off
        return torch.full((n, c), off).scatter_(1, target.view(-1, 1), on)
    return target * (1.0 - smoothing) + smoothing / c if smoothing > 0 else target


for i, case in enumerate(cfg["cases"]):
    x = logits.clone().to(torch.bfloat16 if case["bf16"] else torch.float32).requires_grad_(True)
    target = soft if case["soft"] else labels
    weight = weights if case["weights"] else None
    smoothing = case["label_smoothing"]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case["bf16"]):
        xf = x.float()
        if case["loss"] == "cross_entropy":
            loss = F.cross_entropy(xf, target, weight=weight, label_smoothing=smoothing)
        else:
            loss = F.binary_cross_entropy_with_logits(
                xf, bce_target(target, smoothing), weight=weight,
                pos_weight=pos_weight if case["pos_weight"] else None)
    assert loss.dtype == torch.float32
    loss.backward()
    s.save(f"loss_{i}.bin", loss.reshape(1))
    s.save(f"grad_{i}.bin", x.grad.float())
