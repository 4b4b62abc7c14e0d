"""Oracle for whole learning-rate schedules, warm-up included: the rate each optimizer step of a
run trains at, from PyTorch's own schedulers or from Pet's get_lr.

config.json: {"cases": [{"name", "base_lr", "iters", "program"}]}. For each case writes
<name>.bin: `iters` float64 rates, entry k - 1 being the rate of the k-th optimizer step.
A program is one of:
  {"torch": SPEC, "every": E}  torch.optim.lr_scheduler objects on an SGD optimizer; the rate of a
      step is the group's lr when optimizer.step() runs, and scheduler.step() follows every E-th
      optimizer step (E = 1: stepped per iteration; E = iterations per epoch: per epoch), as in
      training. SPEC is {"class", "kwargs"}, or {"class": "SequentialLR", "schedulers": [SPEC..],
      "milestones": [..]}, or {"class": "ChainedScheduler", "schedulers": [SPEC..]}.
  {"pet": {"policy": "STEP" | "COSINE" | "POLY", "steps", "gamma", "power", "max_iter",
      "warm_up_method": "NONE" | "CONSTANT" | "LINEAR", "warm_up_iters", "warm_up_factor"}}
      Pet's get_lr at it = k (tests/reference anchors: "Pet's schedule, exactly").
  {"splice": W, "warmup": PROGRAM, "main": PROGRAM, "restart": bool}  the warm-up program's rates
      for steps 1..W, then the main program's: its step k (restart false) or k - W (restart true,
      a program that starts after the warm-up, as SequentialLR does).
"""
import bisect
import math
import warnings

import numpy as np
import torch

from common import Scratch


def build(spec, opt):
    cls = getattr(torch.optim.lr_scheduler, spec["class"])
    if spec["class"] == "SequentialLR":
        inner = [build(s, opt) for s in spec["schedulers"]]
        return cls(opt, schedulers=inner, milestones=spec["milestones"])
    if spec["class"] == "ChainedScheduler":
        inner = [build(s, opt) for s in spec["schedulers"]]
        return cls(inner, optimizer=opt)
    return cls(opt, **spec.get("kwargs", {}))


def run_torch(program, base_lr, iters):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=base_lr)
    scheduler = build(program["torch"], opt)
    every = program.get("every", 1)
    rates = []
    for k in range(1, iters + 1):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        if k % every == 0:
            scheduler.step()
    return rates


def pet_get_lr(p, base_lr, it):
    warm = p.get("warm_up_iters", 0)
    method = p.get("warm_up_method", "NONE")
    if method != "NONE" and it <= warm:
        factor = p["warm_up_factor"]
        if method == "CONSTANT":
            return base_lr * factor
        alpha = it / warm
        return base_lr * (factor * (1 - alpha) + alpha)
    if p["policy"] == "STEP":
        return base_lr * p["gamma"] ** bisect.bisect_right(p["steps"], it)
    span = p["max_iter"] - warm
    if p["policy"] == "COSINE":
        return 0.5 * base_lr * (math.cos((it - warm - 1) * math.pi / span) + 1)
    if p["policy"] == "POLY":
        return base_lr * (1 - (it - warm - 1) / span) ** p["power"]
    raise ValueError("unknown Pet policy " + p["policy"])


def rates_of(program, base_lr, iters):
    if "torch" in program:
        return run_torch(program, base_lr, iters)
    if "pet" in program:
        return [pet_get_lr(program["pet"], base_lr, it) for it in range(1, iters + 1)]
    w = program["splice"]
    warm = rates_of(program["warmup"], base_lr, w)
    main = rates_of(program["main"], base_lr, iters)
    return warm + [main[(k - w if program["restart"] else k) - 1] for k in range(w + 1, iters + 1)]


s = Scratch()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # SequentialLR's and step(epoch)'s deprecation notes
    for case in s.config["cases"]:
        rates = rates_of(case["program"], case["base_lr"], case["iters"])
        s.save(case["name"] + ".bin", torch.tensor(rates, dtype=torch.float64), dtype=np.float64)
