"""Oracle for the sgd plugin: torch.optim.SGD over a sequence of given gradients and rates."""
import torch

from common import Scratch

s = Scratch()
cfg = s.config
steps = cfg["steps"]
params = [torch.nn.Parameter(s.load(f"p{i}.bin", shape)) for i, shape in enumerate(cfg["shapes"])]
grads = [s.load(f"g{i}.bin", [steps] + shape) for i, shape in enumerate(cfg["shapes"])]
opt = torch.optim.SGD(params, lr=cfg["lrs"][0], momentum=cfg["momentum"],
                      dampening=cfg["dampening"], weight_decay=cfg["weight_decay"],
                      nesterov=cfg["nesterov"])
for step in range(steps):
    for group in opt.param_groups:
        group["lr"] = cfg["lrs"][step]
    for p, g in zip(params, grads):
        p.grad = g[step].clone()
    opt.step()
for i, p in enumerate(params):
    s.save(f"p{i}_out.bin", p)
    if cfg["momentum"] != 0:
        s.save(f"buf{i}_out.bin", opt.state[p]["momentum_buffer"])
