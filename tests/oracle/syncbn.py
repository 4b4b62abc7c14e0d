"""Oracle for the syncbn plugin: torch.nn.BatchNorm on the concatenated samples of each
statistics group (what SyncBatchNorm over that group computes): per-rank slices of the output
and input gradient, the group's weight/bias gradients (= the sum over its ranks of the local
ones), and the running statistics after the training steps; then one eval step."""
import torch

from common import Scratch

s = Scratch()
cfg = s.config
shapes, eps, momentum = cfg["shapes"], cfg["eps"], cfg["momentum"]
world = len(shapes)
k = cfg["group_size"] or world
channels = shapes[0][1]
cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
       5: torch.nn.BatchNorm3d}[len(shapes[0])]
tags = [str(i) for i in range(cfg["train_steps"])] + ["_eval"]

for g in range(world // k):
    ranks = list(range(g * k, (g + 1) * k))
    sizes = [shapes[r][0] for r in ranks]
    bn = cls(channels, eps=eps, momentum=momentum, affine=cfg["affine"])
    params = []
    if cfg["affine"]:
        with torch.no_grad():
            bn.weight.copy_(s.load("weight.bin", [channels]))
            bn.bias.copy_(s.load("bias.bin", [channels]))
        params = [bn.weight, bn.bias]
    for tag in tags:
        if tag == "_eval":
            s.save(f"rm_g{g}.bin", bn.running_mean)
            s.save(f"rv_g{g}.bin", bn.running_var)
            bn.eval()
        x = torch.cat([s.load(f"x{tag}_r{r}.bin", shapes[r]) for r in ranks]).requires_grad_()
        gy = torch.cat([s.load(f"gy{tag}_r{r}.bin", shapes[r]) for r in ranks])
        y = bn(x)
        grads = torch.autograd.grad(y, [x] + params, gy)
        for r, ys, gxs in zip(ranks, y.split(sizes), grads[0].split(sizes)):
            s.save(f"y{tag}_r{r}.bin", ys)
            s.save(f"gx{tag}_r{r}.bin", gxs)
        if params:
            s.save(f"gw{tag}_g{g}.bin", grads[1])
            s.save(f"gb{tag}_g{g}.bin", grads[2])
