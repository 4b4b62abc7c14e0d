"""Oracle for the lr policies: PyTorch's own schedulers, stepped as in training.

config.json: {"cases": [{"name", "scheduler" (a torch.optim.lr_scheduler class), "kwargs",
"base_lr", "steps"}]}. For each case writes <name>.bin: steps + 1 float64 rates, entry e being
get_last_lr() after e scheduler steps (last_epoch = e; entry 0 is the initial rate). Each
scheduler.step() follows an optimizer.step(), as PyTorch expects, and uses the scheduler's own
(recursive) update rather than its closed form."""
import warnings

import numpy as np
import torch

from common import Scratch

s = Scratch()
for case in s.config["cases"]:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=case["base_lr"])
    scheduler = getattr(torch.optim.lr_scheduler, case["scheduler"])(opt, **case["kwargs"])
    rates = [scheduler.get_last_lr()[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(case["steps"]):
            opt.step()
            scheduler.step()
            rates.append(scheduler.get_last_lr()[0])
    s.save(case["name"] + ".bin", torch.tensor(rates, dtype=torch.float64), dtype=np.float64)
