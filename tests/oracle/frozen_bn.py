"""Oracle for the frozen_bn plugin: FrozenBatchNorm2d as torchvision.ops.misc writes it (fixed
buffers, y = x * scale + shift), generalised to N x C x ... inputs; output and input gradient."""
import torch

from common import Scratch


class FrozenBatchNorm2d(torch.nn.Module):
    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x):
        shape = [1, -1] + [1] * (x.dim() - 2)
        w = self.weight.reshape(shape)
        b = self.bias.reshape(shape)
        rv = self.running_var.reshape(shape)
        rm = self.running_mean.reshape(shape)
        scale = w * (rv + self.eps).rsqrt()
        bias = b - rm * scale
        return x * scale + bias


s = Scratch()
cfg = s.config
shape = cfg["shape"]
channels = shape[1]
bn = FrozenBatchNorm2d(channels, eps=cfg["eps"])
for name in ["weight", "bias", "running_mean", "running_var"]:
    getattr(bn, name).copy_(s.load(f"{name}.bin", [channels]))
x = s.load("x.bin", shape).requires_grad_()
y = bn(x)
(gx,) = torch.autograd.grad(y, [x], s.load("gy.bin", shape))
s.save("y.bin", y)
s.save("gx.bin", gx)
