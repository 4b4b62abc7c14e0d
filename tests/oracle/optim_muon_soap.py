"""Oracle for the muon and soap plugins: runs every case of config.json ("cases") through
torch.optim.Muon (torch 2.11) or pytorch_optimizer.SOAP (pytorch-optimizer 4.1.0) on
config["device"], over the initial parameters <set>_p<i>.bin and gradient sequences
<set>_g<i>.bin ([steps, shape...]) of the case's set (config["sets"][set]: steps and shapes), in
the case's dtype, and writes <case>_p<i>.bin, <case>_<state><i>.bin for each tensor state and
<case>_state<i>.txt (those state names, sorted). SOAP's matrix lists are written per dimension:
<case>_GG<i>_<d>.bin and <case>_Q<i>_<d>.bin for each dimension d with a basis, and
<case>_dims<i>.txt gives every dimension's basis size (0: none, the identity). Options absent
from a case take the reference's defaults."""
import torch
from pytorch_optimizer import SOAP

from common import Scratch

s = Scratch()
cfg = s.config
device = torch.device(cfg["device"])
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make(kind, params, lr, wd, o):
    if kind == "muon":
        kwargs = {k: o[k] for k in ("momentum", "nesterov", "eps", "ns_steps", "adjust_lr_fn")
                  if k in o}
        if any(k in o for k in ("ns_a", "ns_b", "ns_c")):
            kwargs["ns_coefficients"] = (o.get("ns_a", 3.4445), o.get("ns_b", -4.775),
                                         o.get("ns_c", 2.0315))
        return torch.optim.Muon(params, lr=lr, weight_decay=wd, **kwargs)
    if kind == "soap":
        kwargs = {k: o[k] for k in ("eps", "precondition_frequency", "max_precondition_dim",
                                    "merge_dims", "precondition_1d", "correct_bias",
                                    "normalize_gradient", "data_format") if k in o}
        if "beta1" in o or "beta2" in o:
            kwargs["betas"] = (o.get("beta1", 0.95), o.get("beta2", 0.95))
        if "shampoo_beta" in o:
            kwargs["shampoo_beta"] = None if o["shampoo_beta"] < 0 else o["shampoo_beta"]
        return SOAP(params, lr=lr, weight_decay=wd, **kwargs)
    raise ValueError(f"unknown optimizer {kind}")


def save(name, tensor):
    s.save(name, tensor.detach().float())


sets = {}
for set_name, spec in cfg["sets"].items():
    steps, shapes = spec["steps"], spec["shapes"]
    initial = [s.load(f"{set_name}_p{i}.bin", shape) for i, shape in enumerate(shapes)]
    grads = [s.load(f"{set_name}_g{i}.bin", [steps] + shape) for i, shape in enumerate(shapes)]
    sets[set_name] = (steps, initial, grads)

for case in cfg["cases"]:
    name, lrs = case["name"], case["lrs"]
    steps, initial, grads = sets[case["set"]]
    dtype = DTYPES[case.get("dtype", "float32")]
    params = [torch.nn.Parameter(p.to(device, dtype, copy=True)) for p in initial]
    grads = [g.to(device, dtype) for g in grads]
    opt = make(case["optimizer"], params, lrs[0], case["weight_decay"], case["options"])
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        for p, g in zip(params, grads):
            p.grad = g[step].clone()
        opt.step()
    for i, p in enumerate(params):
        save(f"{name}_p{i}.bin", p)
        state = opt.state[p]
        tensors = sorted(k for k, v in state.items() if isinstance(v, torch.Tensor))
        (s.dir / f"{name}_state{i}.txt").write_text(",".join(tensors))
        for key in tensors:
            save(f"{name}_{key}{i}.bin", state[key])
        if case["optimizer"] == "soap":
            dims = []
            for d, (gg, q) in enumerate(zip(state["GG"], state["Q"])):
                dims.append(gg.shape[0] if len(gg) > 0 else 0)
                if len(gg) > 0:
                    save(f"{name}_GG{i}_{d}.bin", gg)
                    save(f"{name}_Q{i}_{d}.bin", q)
            (s.dir / f"{name}_dims{i}.txt").write_text(",".join(str(d) for d in dims))
