"""Oracle for the step lr policy: torch.optim.lr_scheduler.MultiStepLR's rate after each of
iterations 1..max_iters, as float64."""
import numpy as np
import torch

from common import Scratch

s = Scratch()
cfg = s.config
param = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([param], lr=cfg["base_lr"])
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=cfg["steps"], gamma=cfg["gamma"])
rates = []
for _ in range(cfg["max_iters"]):
    opt.step()
    sched.step()
    rates.append(sched.get_last_lr()[0])
s.save("lr.bin", torch.tensor(rates, dtype=torch.float64), dtype=np.float64)
