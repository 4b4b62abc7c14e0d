"""PyTorch twins of bench/memory.py's networks, timed the same way: the pre-activation ResNet with
BatchNorm + LeakyReLU, and the deep MLP (Linear, BatchNorm1d, ReLU) plain and under
torch.utils.checkpoint.checkpoint_sequential with the same sqrt(n) segment count. Prints one
JSON line: {"arm": ..., "step_ms": median, "activation_mb": ...}. PyTorch has no InPlace-ABN. On
the CPU it has no tensor-memory counter, so activation_mb is null there and the arms give the
time reference only; on CUDA it is the step's peak of allocated memory above what was allocated
when the step began (the caching allocator's counts), as Kiln's activation_mb."""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


class PreActBlock(nn.Module):
    def __init__(self, cin, planes, stride, slope):
        super().__init__()
        self.slope = slope
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.proj = (nn.Conv2d(cin, planes, 1, stride, 0, bias=False)
                     if stride != 1 or cin != planes else None)

    def forward(self, x):
        a = F.leaky_relu(self.bn1(x), self.slope, inplace=True)
        shortcut = self.proj(a) if self.proj is not None else x
        out = self.conv1(a)
        out = self.conv2(F.leaky_relu(self.bn2(out), self.slope, inplace=True))
        return out.add_(shortcut)


class PreActResNet(nn.Module):
    """Kiln's resnet with depth "small", preact = true, activation "leaky_relu"."""

    def __init__(self, width, blocks, channels, classes, slope=0.01):
        super().__init__()
        self.slope = slope
        self.stem = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        layers, cin = [], width
        for i, count in enumerate(blocks):
            planes = width * 2 ** i
            for b in range(count):
                layers.append(PreActBlock(cin, planes, 2 if i > 0 and b == 0 else 1, slope))
                cin = planes
        self.layers = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(cin)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        x = F.leaky_relu(self.bn(x), self.slope, inplace=True)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))  # as Kiln's resnet


def mlp(depth, hidden, inputs, classes):
    """Kiln's mlp with norm_layers = true: hidden layers of Linear, BatchNorm1d, ReLU."""
    layers, last = [], inputs
    for _ in range(depth):
        layers.append(nn.Sequential(nn.Linear(last, hidden), nn.BatchNorm1d(hidden), nn.ReLU()))
        last = hidden
    return nn.Sequential(*layers), nn.Linear(last, classes)


def time_steps(step, steps, warmup, device):
    """Median step time in ms and, on CUDA, median activation MiB over the steps after warm-up."""
    cuda = device.type == "cuda"
    times, memory = [], []
    for i in range(steps):
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            resting = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            if cuda:
                memory.append((torch.cuda.max_memory_allocated(device) - resting) / 2**20)
    return statistics.median(times) * 1e3, statistics.median(memory) if memory else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arm", required=True, choices=["resnet", "mlp", "mlp-sqrt"])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--depth", type=int, default=36)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    if args.arm == "resnet":
        model = PreActResNet(args.width, [args.blocks] * 3, 3, 10)
        x = torch.randn(args.batch, 3, 32, 32)
        forward = model
    else:
        body, head = mlp(args.depth, args.hidden, 28 * 28, 10)
        model = nn.Sequential(body, head)
        x = torch.randn(args.batch, 1, 28, 28)
        segments = math.ceil(args.depth / math.ceil(math.sqrt(args.depth)))
        if args.arm == "mlp":
            forward = lambda t: model(t.flatten(1))
        else:
            forward = lambda t: head(checkpoint_sequential(body, segments, t.flatten(1),
                                                           use_reentrant=False))
    y = torch.randint(0, 10, (args.batch,))
    model, x, y = model.to(device), x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(forward(x), y).backward()
        optimizer.step()

    step_ms, activation_mb = time_steps(step, args.steps, args.warmup, device)
    print(json.dumps({"arm": args.arm, "step_ms": step_ms, "activation_mb": activation_mb}))


if __name__ == "__main__":
    main()
