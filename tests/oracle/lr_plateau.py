"""Oracle for the reacting lr policies: torch.optim.lr_scheduler.ReduceLROnPlateau fed a metric
per evaluation, as in training (optimizer.step(), then scheduler.step(metric)).

config.json: {"cases": [{"name", "kwargs" (ReduceLROnPlateau's, besides the optimizer),
"base_lr", "metrics" (one float per evaluation)}]}. For each case writes <name>.bin: the group's
lr after each scheduler.step, one float64 per metric."""
import numpy as np
import torch

from common import Scratch

s = Scratch()
for case in s.config["cases"]:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=case["base_lr"])
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **case["kwargs"])
    rates = []
    for metric in case["metrics"]:
        opt.step()
        scheduler.step(metric)
        rates.append(opt.param_groups[0]["lr"])
    s.save(case["name"] + ".bin", torch.tensor(rates, dtype=torch.float64), dtype=np.float64)
