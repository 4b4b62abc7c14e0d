"""Oracle for the vit model plugin: the same pre-norm ViT written with torch.nn.functional, fed
the plugin's parameters by name; eval-mode logits in float32 and under CPU bfloat16 autocast, and
the float32 gradient of every parameter for the loss sum(logits * upstream)."""
import torch
import torch.nn.functional as F

from common import Scratch

EPS = 1e-6  # timm's and torchvision's ViT LayerNorm eps


def linear(x, p, name):
    return F.linear(x, p[name + ".weight"], p[name + ".bias"])


def layer_norm(x, p, name):
    # Normalise in the parameters' dtype, return in the input's (the plugin's LayerNorm).
    w, b = p[name + ".weight"], p[name + ".bias"]
    if x.dtype == w.dtype:
        return F.layer_norm(x, w.shape, w, b, EPS)
    return F.layer_norm(x.to(w.dtype), w.shape, w, b, EPS).to(x.dtype)


def attention(x, p, name, heads):
    n, t, d = x.shape
    qkv = linear(x, p, name + ".qkv").reshape(n, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    x = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
    return linear(x.transpose(1, 2).reshape(n, t, d), p, name + ".proj")


def vit(images, p, case, depth, heads):
    x = F.conv2d(images, p["patch_embed.proj.weight"], p["patch_embed.proj.bias"],
                 stride=case["patch"])
    x = x.flatten(2).transpose(1, 2)  # [N, tokens, dim]
    cls = case["pool"] == "cls"
    if cls:
        x = torch.cat([p["cls_token"].expand(x.shape[0], -1, -1), x], 1)
    x = x + p["pos_embed"]
    for i in range(depth):
        b = f"blocks.{i}"
        x = x + attention(layer_norm(x, p, b + ".norm1"), p, b + ".attn", heads)
        h = F.gelu(linear(layer_norm(x, p, b + ".norm2"), p, b + ".mlp.fc1"))
        x = x + linear(h, p, b + ".mlp.fc2")
    x = layer_norm(x, p, "norm")
    return linear(x[:, 0] if cls else x.mean(1), p, "head")


s = Scratch()
cfg = s.config
for case in cfg["cases"]:
    pre = case["prefix"]
    params = {name: s.load(pre + name + ".bin", shape) for name, shape in case["params"].items()}
    images = s.load(pre + "images.bin", case["shape"])
    for p in params.values():
        p.requires_grad_(True)
    logits = vit(images, params, case, cfg["depth"], cfg["heads"])
    s.save(pre + "logits_fp32.bin", logits.detach())
    (logits * s.load(pre + "upstream.bin", logits.shape)).sum().backward()
    for name, p in params.items():
        s.save(pre + "grad." + name + ".bin", p.grad)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = vit(images, params, case, cfg["depth"], cfg["heads"])
        s.save(pre + "logits_bf16.bin", logits.float())
