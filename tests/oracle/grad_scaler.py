"""Oracle for kiln_amp's dynamic loss scale: torch.amp.GradScaler itself, stepped as in training.

config.json: {"cases": [{"name", "init_scale", "growth_factor", "backoff_factor",
"growth_interval", "finite": [1, 0, ...]}]}. Per case: a one-parameter SGD model and a CPU
GradScaler; per step p.grad is set to a finite value, or to inf / nan (alternately) where
`finite` is 0, then scaler.step(opt) and scaler.update(). Writes <name>.bin: float64
scaler.get_scale() after every update. Fails when a skipped step moved the parameter or a clean
one did not (GradScaler's own contract, so the oracle is known to be driven right)."""
import numpy as np
import torch

from common import Scratch

s = Scratch()
for case in s.config["cases"]:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    scaler = torch.amp.GradScaler(
        "cpu",
        init_scale=case["init_scale"],
        growth_factor=case["growth_factor"],
        backoff_factor=case["backoff_factor"],
        growth_interval=case["growth_interval"],
    )
    scaler.scale(torch.ones(()))  # creates the scale tensor, as the first backward would
    scales = []
    overflows = 0
    for step, finite in enumerate(case["finite"]):
        before = param.detach().clone()
        if finite:
            grad = 1.0 + step
        else:
            grad = float("inf") if overflows % 2 == 0 else float("nan")
            overflows += 1
        param.grad = torch.full((1,), grad * scaler.get_scale())
        scaler.step(opt)
        scaler.update()
        moved = not torch.equal(before, param.detach())
        if moved != bool(finite):
            raise SystemExit(f"{case['name']} step {step}: finite={finite} but moved={moved}")
        scales.append(scaler.get_scale())
    s.save(case["name"] + ".bin", torch.tensor(scales, dtype=torch.float64), dtype=np.float64)
