"""Oracle for model.init with torchvision's and timm's own models: each case's model is built by
torchvision (resnet18/34/50/...) or timm (VisionTransformer), randomly initialised (no download),
its norm layers' affine parameters and running statistics then randomised so that they matter,
and saved with scripts/export_torchvision.py's writer. For "full" cases the script also writes a
random input and the model's logits in eval mode and in train mode (batch statistics), and the
state after that train-mode forward (the updated running statistics); for "names" cases (the
deep ResNets, slow on a small CPU) only every state_dict name with its shape, one per line.
Only the buffers are written after the forward (a ViT has none: no file)."""
import pathlib
import sys

import safetensors.torch
import torch

from common import Scratch

# This folder's inplace_abn.py (another oracle) would shadow the package timm tries to import.
HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parents[1] / "scripts"))
import export_torchvision  # noqa: E402


def build(case):
    if case["name"] == "vit":
        from timm.models.vision_transformer import VisionTransformer
        return VisionTransformer(num_classes=case["classes"], **case["timm"])
    return export_torchvision.build(case["name"], random=True, num_classes=case["classes"])


def randomise_norms(model, g):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.num_batches_tracked.fill_(7)


s = Scratch()
for case in s.config["cases"]:
    pre = s.dir / case["prefix"]
    torch.manual_seed(case["seed"])
    g = torch.Generator().manual_seed(case["seed"])
    model = build(case)
    randomise_norms(model, g)
    if case["kind"] == "names":
        lines = [" ".join([name] + [str(d) for d in t.shape]) for name, t in
                 model.state_dict().items()]
        pathlib.Path(str(pre) + "names.txt").write_text("\n".join(lines) + "\n")
        continue
    export_torchvision.save(model, str(pre) + "weights.safetensors")
    x = torch.randn(case["input"], generator=g)
    s.save(case["prefix"] + "x.bin", x)
    model.eval()
    with torch.no_grad():
        s.save(case["prefix"] + "eval.bin", model(x))
        model.train()
        s.save(case["prefix"] + "train.bin", model(x))
    buffers = {name for name, _ in model.named_buffers()}
    if not buffers:
        continue
    after = {k: t for k, t in export_torchvision.state_dict(model).items() if k in buffers}
    safetensors.torch.save_file(after, str(pre) + "after.safetensors")
