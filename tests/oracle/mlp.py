"""Oracle for the mlp model plugin: flatten, [F.linear, F.relu] per hidden layer, F.linear head,
fed the plugin's parameters by name. Float32 logits, the float32 gradient of every parameter and
of the images for the loss sum(logits * upstream), and the logits under CPU bfloat16 autocast."""
import torch
import torch.nn.functional as F

from common import Scratch


def mlp(images, p, hidden):
    x = images.flatten(1)
    for i in range(hidden):
        x = F.relu(F.linear(x, p[f"layers.{i}.linear.weight"], p[f"layers.{i}.linear.bias"]))
    return F.linear(x, p["head.weight"], p["head.bias"])


s = Scratch()
cfg = s.config
params = {name: s.load(name + ".bin", shape).requires_grad_(True)
          for name, shape in cfg["params"].items()}
images = s.load("images.bin", cfg["shape"]).requires_grad_(True)
logits = mlp(images, params, cfg["hidden"])
s.save("logits_fp32.bin", logits.detach())
(logits * s.load("upstream.bin", logits.shape)).sum().backward()
for name, p in params.items():
    s.save("grad." + name + ".bin", p.grad)
s.save("grad.images.bin", images.grad)
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    logits = mlp(images, params, cfg["hidden"])
s.save("logits_bf16.bin", logits.float())
