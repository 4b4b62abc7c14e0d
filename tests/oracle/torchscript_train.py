"""Oracle for the torchscript model plugin: a model written in Python, trained by Kiln.

Phase "prepare" writes a small IDX dataset (Fashion-MNIST's file names and format) and a small
convolutional network defined here (conv -> BatchNorm2d -> relu -> max pool -> linear, times a
plain buffer) saved with torch.jit.save as net.pt (torch.jit.script) and traced.pt (torch.jit.trace
of the same weights); for the refusals, seven.pt (a scripted net with 7 outputs for 10 classes),
state.pt (torch.save of a state_dict: no TorchScript) and tuple.pt (a forward returning a tuple);
norms.pt (the net with GroupNorm for its batch norm and a LayerNorm before the head); and
other.safetensors, other starting weights by the module's own names (for model.init).
Phase "train" trains the eager twin (of `model`, default net.pt: its weights, or `init` when
given) in PyTorch: SGD with momentum and weight decay (`norm_decay`, when given, for the weight
and bias of every torch norm layer: mmcv's norm_decay_mult), batches in order (no shuffle), the batch-mean cross entropy; then evaluates it
in eval mode on the test split. With `precision` "o2" it trains as apex O2 does, by hand: the
model in bfloat16 but for its batch norm (keep_batchnorm_fp32), float32 master weights stepped
by SGD and cast down into the model, the logits cast up for the loss. Writes result.json: the
loss of every step, the test loss (sum over samples / count) and accuracy, and the final
weights to oracle.safetensors.
Phase "compare" writes to diff.json the largest absolute difference between the tensors of two
safetensors files (cfg "a", "b"), the names of "b" that "a" lacks, and the dtype of each tensor
of "a".
"""
import json
import os

import safetensors.torch
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Scratch, load_split, write_pattern_set


class Net(nn.Module):
    def __init__(self, size, classes):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.head = nn.Linear(4 * (size // 2) ** 2, classes)
        # A buffer outside any layer: the host must move and cast it with the rest.
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1)) * self.scale


class Norms(nn.Module):
    """Net with torch's other norms: GroupNorm after the convolution, LayerNorm before the head."""
    def __init__(self, size, classes):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.norm = nn.LayerNorm(4 * (size // 2) ** 2)
        self.head = nn.Linear(4 * (size // 2) ** 2, classes)

    def forward(self, x):
        return self.head(self.norm(torch.flatten(self.features(x), 1)))


NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm,
         nn.modules.instancenorm._InstanceNorm)
MODELS = {"net.pt": Net, "norms.pt": Norms}


class Pair(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.head = nn.Linear(size * size, 10)

    def forward(self, x):
        y = self.head(torch.flatten(x, 1))
        return y, y


def prepare(s, cfg):
    write_pattern_set(s.dir, cfg, noise=60)
    size = cfg["size"]
    torch.manual_seed(cfg["seed"])
    net = Net(size, 10)
    torch.jit.save(torch.jit.script(net), os.path.join(s.dir, "net.pt"))
    example = torch.zeros(2, 1, size, size)
    torch.jit.save(torch.jit.trace(net, example), os.path.join(s.dir, "traced.pt"))
    torch.jit.save(torch.jit.script(Norms(size, 10)), os.path.join(s.dir, "norms.pt"))
    torch.jit.save(torch.jit.script(Net(size, 7)), os.path.join(s.dir, "seven.pt"))
    torch.jit.save(torch.jit.script(Pair(size)), os.path.join(s.dir, "tuple.pt"))
    torch.save(net.state_dict(), os.path.join(s.dir, "state.pt"))
    other = Net(size, 10)
    safetensors.torch.save_file({k: v.contiguous() for k, v in other.state_dict().items()},
                                os.path.join(s.dir, "other.safetensors"))


def half_but_batch_norm(net, dtype):
    """apex O2's cast: every floating parameter and buffer in `dtype`, batch norm's aside."""
    for module in net.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            continue
        for p in module.parameters(recurse=False):
            p.data = p.data.to(dtype)
        for name, b in module.named_buffers(recurse=False):
            if b.is_floating_point():
                module._buffers[name] = b.to(dtype)


def train(s, cfg):
    torch.set_num_threads(1)
    size = cfg["size"]
    model = cfg.get("model", "net.pt")
    net = MODELS[model](size, 10)
    net.load_state_dict(torch.jit.load(os.path.join(s.dir, model)).state_dict())
    if cfg.get("init"):
        net.load_state_dict(safetensors.torch.load_file(os.path.join(s.dir, cfg["init"])))
    o2 = cfg.get("precision", "fp32") == "o2"
    dtype = torch.bfloat16 if o2 else torch.float32
    if o2:
        half_but_batch_norm(net, dtype)
    x, y = load_split(s.dir, "train", cfg["mean"], cfg["std"])
    params = list(net.parameters())
    stepped = [p.detach().float().clone().requires_grad_() for p in params] if o2 else params
    norm = {id(p) for m in net.modules() if isinstance(m, NORMS) for p in m.parameters()}
    decay = cfg["weight_decay"]
    groups = [{"params": [q for p, q in zip(params, stepped) if id(p) not in norm]},
              {"params": [q for p, q in zip(params, stepped) if id(p) in norm],
               "weight_decay": cfg.get("norm_decay", decay)}]
    opt = torch.optim.SGD(groups, lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=decay)
    batch = cfg["batch"]
    losses = []
    net.train()
    for step in range(cfg["steps"]):
        first = (step * batch) % x.shape[0]
        opt.zero_grad()
        logits = net(x[first:first + batch].to(dtype)).float()
        loss = F.cross_entropy(logits, y[first:first + batch])
        loss.backward()
        if o2:
            for p, q in zip(params, stepped):
                q.grad = p.grad.float()
                p.grad = None
        opt.step()
        if o2:
            with torch.no_grad():
                for p, q in zip(params, stepped):
                    p.copy_(q)
        losses.append(loss.item())
    net.eval()
    xt, yt = load_split(s.dir, "t10k", cfg["mean"], cfg["std"])
    with torch.no_grad():
        logits = net(xt.to(dtype)).float()
        test_loss = F.cross_entropy(logits, yt, reduction="sum").item() / xt.shape[0]
        accuracy = (logits.argmax(1) == yt).sum().item() / xt.shape[0]
    (s.dir / "result.json").write_text(
        json.dumps({"losses": losses, "test_loss": test_loss, "test_accuracy": accuracy}))
    safetensors.torch.save_file({k: v.contiguous() for k, v in net.state_dict().items()},
                                os.path.join(s.dir, "oracle.safetensors"))


def main():
    s = Scratch()
    cfg = s.config
    if cfg["phase"] == "prepare":
        prepare(s, cfg)
    elif cfg["phase"] == "compare":
        a = safetensors.torch.load_file(cfg["a"])
        b = safetensors.torch.load_file(cfg["b"])
        diff = max((a[k].double() - b[k].double()).abs().max().item() for k in b if k in a)
        (s.dir / "diff.json").write_text(
            json.dumps({"max": diff, "missing": sorted(k for k in b if k not in a),
                        "dtypes": {k: str(v.dtype) for k, v in a.items()}}))
    else:
        train(s, cfg)


if __name__ == "__main__":
    main()
