"""Oracle for the optimizer plugins: runs every case of config.json ("cases") through
torch.optim (foreach=False, the single-tensor reference) or the reference LAMB, over the shared
initial parameters p<i>.bin and gradient sequences g<i>.bin ([steps, shape...]), and writes
<case>_p<i>.bin, <case>_<state><i>.bin and <case>_state<i>.txt (the state names, sorted)."""
import torch

from common import Scratch
from optim_lamb import Lamb

s = Scratch()
cfg = s.config
steps, shapes = cfg["steps"], cfg["shapes"]
initial = [s.load(f"p{i}.bin", shape) for i, shape in enumerate(shapes)]
grads = [s.load(f"g{i}.bin", [steps] + shape) for i, shape in enumerate(shapes)]


def make(kind, params, lr, wd, o):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=o["momentum"], dampening=o["dampening"],
                               nesterov=o["nesterov"], weight_decay=wd, foreach=False)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=o["alpha"], eps=o["eps"],
                                   weight_decay=wd, momentum=o["momentum"],
                                   centered=o["centered"], foreach=False)
    if kind in ("adam", "adamw"):
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        return cls(params, lr=lr, betas=(o["beta1"], o["beta2"]), eps=o["eps"], weight_decay=wd,
                   amsgrad=o["amsgrad"], foreach=False)
    if kind == "lamb":
        return Lamb(params, lr=lr, betas=(o["beta1"], o["beta2"]), eps=o["eps"], weight_decay=wd,
                    max_grad_norm=o["max_grad_norm"], bias_correction=o["bias_correction"])
    if kind == "nadam":
        return torch.optim.NAdam(params, lr=lr, betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                                 weight_decay=wd, momentum_decay=o["momentum_decay"],
                                 decoupled_weight_decay=o["decoupled_weight_decay"],
                                 foreach=False)
    if kind == "radam":
        return torch.optim.RAdam(params, lr=lr, betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                                 weight_decay=wd,
                                 decoupled_weight_decay=o["decoupled_weight_decay"],
                                 foreach=False)
    if kind == "adamax":
        return torch.optim.Adamax(params, lr=lr, betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                                  weight_decay=wd, foreach=False)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, lr_decay=o["lr_decay"], weight_decay=wd,
                                   initial_accumulator_value=o["initial_accumulator_value"],
                                   eps=o["eps"], foreach=False)
    if kind == "adadelta":
        return torch.optim.Adadelta(params, lr=lr, rho=o["rho"], eps=o["eps"], weight_decay=wd,
                                    foreach=False)
    if kind == "adafactor":
        # eps1 -1 is the plugin's spelling of torch's None.
        eps1 = None if o["eps1"] == -1 else o["eps1"]
        return torch.optim.Adafactor(params, lr=lr, beta2_decay=o["beta2_decay"],
                                     eps=(eps1, o["eps2"]), d=o["d"], weight_decay=wd,
                                     foreach=False)
    if kind == "asgd":
        return torch.optim.ASGD(params, lr=lr, lambd=o["lambd"], alpha=o["alpha"], t0=o["t0"],
                                weight_decay=wd, foreach=False)
    if kind == "rprop":
        assert wd == 0, "torch.optim.Rprop has no weight decay"
        return torch.optim.Rprop(params, lr=lr, etas=(o["etaminus"], o["etaplus"]),
                                 step_sizes=(o["step_size_min"], o["step_size_max"]),
                                 foreach=False)
    raise ValueError(f"unknown optimizer {kind}")


for case in cfg["cases"]:
    name, lrs = case["name"], case["lrs"]
    params = [torch.nn.Parameter(p.clone()) for p in initial]
    opt = make(case["optimizer"], params, lrs[0], case["weight_decay"], case["options"])
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        for p, g in zip(params, grads):
            p.grad = g[step].clone()
        opt.step()
    for i, p in enumerate(params):
        s.save(f"{name}_p{i}.bin", p)
        state = opt.state[p]
        (s.dir / f"{name}_state{i}.txt").write_text(",".join(sorted(state)))
        for key, value in state.items():
            # Adafactor's factors as torch keeps them: row_var [..., R, 1], col_var [..., 1, C].
            s.save(f"{name}_{key}{i}.bin", value)
