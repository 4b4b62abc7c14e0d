"""Oracle for `kiln export`: Python's safetensors (and torch) load the exported weights into a
plain-torch twin of the kiln mlp (flatten, linear, relu, head) and run it on the test's input."""
import safetensors.torch
import torch
import torch.nn.functional as F

from common import Scratch

s = Scratch()
cfg = s.config
weights = safetensors.torch.load_file(cfg["weights"])
assert all(t.dtype == torch.float32 for t in weights.values()), {k: t.dtype for k, t in weights.items()}
x = s.load("x.bin", cfg["input_shape"])
h = F.relu(F.linear(x.flatten(1), weights["layers.0.linear.weight"], weights["layers.0.linear.bias"]))
y = F.linear(h, weights["head.weight"], weights["head.bias"])
s.save("y.bin", y)
# torch reads the same file through safetensors' torch API too.
with safetensors.safe_open(cfg["weights"], framework="pt") as f:
    assert sorted(f.keys()) == sorted(weights.keys())
