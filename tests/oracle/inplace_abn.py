"""Oracle for the inplace_abn plugins: torch batch norm followed by the activation, with the
weight reparametrised as mapillary InPlace-ABN does, w_eff = |weight| + eps, so the gradient of
the raw (mixed-sign) weight goes through abs(). A few training steps (running statistics
updated by F.batch_norm), then one eval step."""
import torch
import torch.nn.functional as F

from common import Scratch

s = Scratch()
cfg = s.config
shape, eps, momentum = cfg["shape"], cfg["eps"], cfg["momentum"]
channels = shape[1]
kind, param = cfg["activation"], cfg["param"]


def act(y):
    if kind == "leaky_relu":
        return F.leaky_relu(y, param)
    if kind == "elu":
        return F.elu(y, param)
    return y


params = []
weight = bias = None
if cfg["affine"]:
    weight = s.load("weight.bin", [channels]).requires_grad_()
    bias = s.load("bias.bin", [channels]).requires_grad_()
    params = [weight, bias]
running_mean, running_var = torch.zeros(channels), torch.ones(channels)

for tag in [str(i) for i in range(cfg["train_steps"])] + ["_eval"]:
    training = tag != "_eval"
    if not training:
        s.save("running_mean.bin", running_mean)
        s.save("running_var.bin", running_var)
    x = s.load(f"x{tag}.bin", shape).requires_grad_()
    w_eff = weight.abs() + eps if weight is not None else None  # mapillary's reparametrisation
    y = act(F.batch_norm(x, running_mean, running_var, w_eff, bias, training, momentum, eps))
    grads = torch.autograd.grad(y, [x] + params, s.load(f"gy{tag}.bin", shape))
    s.save(f"y{tag}.bin", y)
    s.save(f"gx{tag}.bin", grads[0])
    if params:
        s.save(f"gw{tag}.bin", grads[1])
        s.save(f"gb{tag}.bin", grads[2])
