"""Oracle for gradient clipping: torch.nn.utils.clip_grad_norm_ (returns the total norm) and
clip_grad_value_ on the same gradients."""
import torch

from common import Scratch

s = Scratch()
cfg = s.config
params = []
for i, shape in enumerate(cfg["shapes"]):
    p = torch.zeros(shape, requires_grad=True)
    p.grad = s.load(f"g{i}.bin", shape)
    params.append(p)
if cfg["mode"] == "norm":
    norm_type = float("inf") if cfg["norm_type"] == "inf" else cfg["norm_type"]
    total = torch.nn.utils.clip_grad_norm_(params, cfg["max_norm"], norm_type=norm_type)
    s.save("total.bin", total.reshape(1))
else:
    torch.nn.utils.clip_grad_value_(params, cfg["max_value"])
for i, p in enumerate(params):
    s.save(f"c{i}.bin", p.grad)
