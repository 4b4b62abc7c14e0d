"""Oracle for the host's autocast: the kiln mlp (flatten, [linear, relu]*, linear head) in plain
torch, run under torch.autocast("cpu", dtype=bfloat16) on the same weights and input."""
import torch
import torch.nn.functional as F

from common import Scratch

s = Scratch()
cfg = s.config
shapes = cfg["shapes"]  # [[out, in], [out], ...] weight, bias per linear layer
params = [s.load(f"p{i}.bin", shape) for i, shape in enumerate(shapes)]
x = s.load("x.bin", cfg["input_shape"])
with torch.autocast("cpu", dtype=torch.bfloat16):
    h = x.flatten(1)
    layers = len(params) // 2
    for k in range(layers):
        h = F.linear(h, params[2 * k], params[2 * k + 1])
        if k < layers - 1:
            h = F.relu(h)
    assert h.dtype == torch.bfloat16
s.save("y.bin", h.float())
