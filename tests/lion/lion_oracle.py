"""Oracle for the lion plugin: lion-pytorch's update written out in torch.

argv[1] is a scratch directory with config.json (shapes, steps, lrs, weight_decay, beta1, beta2)
and raw float32 files p{i}.bin (initial parameter) and g{i}.bin ([steps] + shape gradients).
Writes p{i}_out.bin and m{i}_out.bin (exp_avg) after all steps."""
import json
import pathlib
import sys

import numpy as np
import torch

scratch = pathlib.Path(sys.argv[1])
cfg = json.loads((scratch / "config.json").read_text())
steps, beta1, beta2, wd = cfg["steps"], cfg["beta1"], cfg["beta2"], cfg["weight_decay"]


def load(name, shape):
    return torch.from_numpy(np.fromfile(scratch / name, dtype=np.float32).reshape(shape).copy())


for i, shape in enumerate(cfg["shapes"]):
    p = load(f"p{i}.bin", shape)
    grads = load(f"g{i}.bin", [steps] + shape)
    m = torch.zeros_like(p)
    for step in range(steps):
        lr, g = cfg["lrs"][step], grads[step]
        p.mul_(1.0 - lr * wd)
        update = m.clone().mul_(beta1).add(g, alpha=1.0 - beta1).sign_()
        p.add_(update, alpha=-lr)
        m.mul_(beta2).add_(g, alpha=1.0 - beta2)
    p.numpy().tofile(scratch / f"p{i}_out.bin")
    m.numpy().tofile(scratch / f"m{i}_out.bin")
