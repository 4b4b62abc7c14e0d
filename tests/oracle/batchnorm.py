"""Oracle for the batchnorm plugin: torch.nn.BatchNorm{1,2,3}d forward, statistics and autograd
gradients over a few training steps, then one eval step."""
import torch

from common import Scratch

s = Scratch()
cfg = s.config
shape, eps = cfg["shape"], cfg["eps"]
channels = shape[1]
cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
       5: torch.nn.BatchNorm3d}[len(shape)]
bn = cls(channels, eps=eps, momentum=cfg["momentum"], affine=cfg["affine"],
         track_running_stats=cfg["track_running_stats"])
params = []
if cfg["affine"]:
    with torch.no_grad():
        bn.weight.copy_(s.load("weight.bin", [channels]))
        bn.bias.copy_(s.load("bias.bin", [channels]))
    params = [bn.weight, bn.bias]
reduce_dims = [0] + list(range(2, len(shape)))


def run(tag):
    x = s.load(f"x{tag}.bin", shape).requires_grad_(True)
    y = bn(x)
    s.save(f"y{tag}.bin", y)
    grads = torch.autograd.grad(y, [x] + params, s.load(f"gy{tag}.bin", shape))
    s.save(f"gx{tag}.bin", grads[0])
    if params:
        s.save(f"gw{tag}.bin", grads[1])
        s.save(f"gb{tag}.bin", grads[2])
    return x.detach()


bn.train()
for k in range(cfg["train_steps"]):
    x = run(str(k))
    s.save(f"save_mean{k}.bin", x.mean(reduce_dims))
    s.save(f"save_invstd{k}.bin", torch.rsqrt(x.var(reduce_dims, unbiased=False) + eps))
if cfg["track_running_stats"]:
    s.save("running_mean.bin", bn.running_mean)
    s.save("running_var.bin", bn.running_var)
bn.eval()
run("_eval")
