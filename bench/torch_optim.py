"""torch.optim twins of Kiln's optimizers for the bench references, one constructor for all.

A fused SGD twin with momentum starts with zeroed momentum buffers. torch 2.11's fused SGD
(torch/optim/sgd.py, _fused_sgd) creates them with torch.empty_like on its first step and passes
is_first_step = True only while every buffer is None; GradScaler hands found_inf to the fused
kernel, which then returns without writing them. When the first step overflows (fp16 from
GradScaler's initial scale 2^16 usually does), every later step reads uninitialised memory as
momentum, and the weights turn non-finite one step later, for good. Zeroed buffers with
is_first_step = False give the first applied step momentum * 0 + (1 - dampening) * g, which is
torch's first step (buffer = g) exactly when dampening is 0; with dampening the fused twin is
refused. tests/python/test_bench_optim.py checks the twin against torch's per-parameter loop
across overflowing steps.
"""
import torch

IMPLS = ["default", "foreach", "fused", "loop"]


def impl_flags(impl):
    """torch.optim's implementation switch for --optim-impl / --torch-optim."""
    return {"default": {}, "foreach": dict(foreach=True), "fused": dict(fused=True),
            "loop": dict(foreach=False)}[impl]


def prime_fused_sgd(opt):
    """Zeroed momentum buffers in the parameters' layout (see the module's docstring)."""
    for group in opt.param_groups:
        if group["momentum"] == 0:
            continue
        if group["dampening"] != 0:
            raise SystemExit("fused SGD with dampening: torch 2.11's fused kernel loses the first "
                             "step's momentum after a skipped step; use --optim-impl foreach")
        for p in group["params"]:
            opt.state[p]["momentum_buffer"] = torch.zeros_like(
                p, memory_format=torch.preserve_format)


def make_optimizer(groups, opt, impl):
    """torch.optim twin of the pipeline's [optimizer] over `groups` (dicts of params, lr_scale
    and weight_decay, as precision_reference.param_groups gives them)."""
    flags = impl_flags(impl)
    lr = opt["lr"]
    pg = [dict(params=g["params"], lr=lr * g["lr_scale"], weight_decay=g["weight_decay"])
          for g in groups]
    if opt["name"] == "sgd":
        sgd = torch.optim.SGD(pg, lr=lr, momentum=opt.get("momentum", 0.0),
                              dampening=opt.get("dampening", 0.0),
                              nesterov=opt.get("nesterov", False), **flags)
        if sgd.defaults.get("fused"):
            prime_fused_sgd(sgd)
        return sgd
    if opt["name"] in ("adamw", "adam"):
        cls = torch.optim.AdamW if opt["name"] == "adamw" else torch.optim.Adam
        return cls(pg, lr=lr, betas=(opt.get("beta1", 0.9), opt.get("beta2", 0.999)),
                   eps=opt.get("eps", 1e-8), amsgrad=opt.get("amsgrad", False), **flags)
    raise ValueError(f"no torch.optim twin for optimizer '{opt['name']}'")
