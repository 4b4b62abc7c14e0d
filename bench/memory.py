"""Activation memory and step time of Kiln's memory features, in one run, measured by Kiln itself.

Two pairs of arms, each pair training the same network on the same in-memory synthetic data,
the arms alternating run by run:

  (a) InPlace-ABN against BN + LeakyReLU on a ResNet-style network: the `resnet` model with
      pre-activation blocks (preact = true: every norm is followed by its activation and a conv)
      and activation "leaky_relu", model.norm = "batchnorm" (BN, then LeakyReLU in place: the
      layer keeps its input and the activation its output) against model.norm = "inplace_abn"
      (one tensor: the output, written over the input);
  (b) activation checkpointing "sqrt" against "none" on a deep network: the `mlp` model with
      --depth hidden layers (Linear, BatchNorm, ReLU), memory.checkpoint = "sqrt" keeping only
      the inputs of sqrt(n) segments and recomputing the rest in backward. The batch is large
      against the width, as in the memory-bound runs checkpointing is for: activations, not
      weights, fill the memory.

Measured per optimizer step from Kiln's --metrics records: `activation_mb` (the peak of live
tensor storage during the step above what was live when it began: weights and optimizer state
excluded, the gradients backward creates included, as both arms of a pair create the same;
counted by Kiln's CPU allocator counter, or the CUDA caching allocator's statistics on a GPU)
and `step_time` (forward, backward, optimizer). A run's value is the median
over the steps after --warmup; the table gives the median over --repeats runs with the min–max
in brackets, and each pair's ratio of medians.

  # defaults: about 4 minutes on 2 cores
  ~/.cache/kiln/venv/bin/python bench/memory.py
  ~/.cache/kiln/venv/bin/python bench/memory.py --quick      # smoke run, under a minute
  ~/.cache/kiln/venv/bin/python bench/memory.py --device cuda

The same run times PyTorch twins (bench/memory_reference.py: the same networks and batches,
BatchNorm + LeakyReLU, and torch.utils.checkpoint.checkpoint_sequential with the same segment
count), for a time reference and, on CUDA, a memory one (the caching allocator's peak above the
step's start): PyTorch has no InPlace-ABN and no CPU tensor-memory counter.

Targets: InPlace-ABN <= 0.7x the activation memory of BN + LeakyReLU at <= 1.10x the time;
checkpointing sqrt <= 0.4x the activation memory of none at <= 1.4x the time.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

from bench_common import cpu_name, toml_value

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pipeline(args, arm, work):
    image, batch = arm["image"], arm["batch"]
    samples = batch * (args.steps + 2)
    cfg = {
        "run": {"device": args.device, "seed": 0, "max_steps": args.steps, "epochs": 2,
                "log_interval": args.steps, "threads": args.threads, "eval": False,
                "checkpoints": False, "tensorboard": False,
                "output_dir": os.path.join(work, "out")},
        "data": {"dataset": "synthetic", "synthetic_train": samples, "synthetic_test": 16,
                 "synthetic_classes": 10, "channels": image[0], "height": image[1],
                 "width": image[2], "batch_size": batch, "workers": 0},
        "model": arm["model"],
        "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9},
        "lr_policy": {"name": "constant"},
        "memory": {"checkpoint": arm.get("checkpoint", "none")},
    }
    lines = []
    for section, body in cfg.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
        lines.append("")
    return "\n".join(lines)


def run_arm(args, arm):
    with tempfile.TemporaryDirectory(prefix="kiln-bench-memory-") as work:
        path = os.path.join(work, "pipeline.toml")
        metrics = os.path.join(work, "metrics.jsonl")
        with open(path, "w") as f:
            f.write(pipeline(args, arm, work))
        cmd = [args.kiln, "run", path, "--metrics", metrics]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        steps = []
        if os.path.exists(metrics):
            with open(metrics) as f:
                steps = [r for r in map(json.loads, f) if r["type"] == "step"]
        if proc.returncode != 0 or len(steps) < args.steps:
            raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode} with {len(steps)} "
                               f"step records; output:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        kept = steps[args.warmup:]
        return (statistics.median(r["activation_mb"] for r in kept),
                statistics.median(r["step_time"] for r in kept))


def run_reference(args, arm, batch):
    cmd = [sys.executable, os.path.join(REPO, "bench", "memory_reference.py"), "--arm", arm,
           "--batch", str(batch), "--width", str(args.width), "--blocks", str(args.blocks),
           "--hidden", str(args.hidden), "--depth", str(args.depth), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--threads", str(args.threads), "--device", args.device]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["step_ms"] / 1e3, result["activation_mb"]  # MiB: None on the CPU


def arms(args):
    resnet = {"name": "resnet", "depth": "small", "preact": True, "activation": "leaky_relu",
              "width": args.width, "blocks": [args.blocks] * 3}
    mlp = {"name": "mlp", "hidden": [args.hidden] * args.depth, "norm_layers": True}
    return [
        ("a", "BN + LeakyReLU", {"model": dict(resnet, norm="batchnorm"), "image": (3, 32, 32),
                                     "batch": args.batch}),
        ("a", "InPlace-ABN", {"model": dict(resnet, norm="inplace_abn"), "image": (3, 32, 32),
                              "batch": args.batch}),
        ("b", "checkpoint none", {"model": mlp, "image": (1, 28, 28), "checkpoint": "none",
                                  "batch": args.mlp_batch}),
        ("b", "checkpoint sqrt", {"model": mlp, "image": (1, 28, 28), "checkpoint": "sqrt",
                                  "batch": args.mlp_batch}),
    ]


def spread(values):
    return f"{statistics.median(values):9.2f} [{min(values):.2f}-{max(values):.2f}]"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kiln", default=os.path.join(REPO, "build", "release", "bin", "kiln"))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=32, help="resnet batch")
    p.add_argument("--mlp-batch", type=int, default=1024)
    p.add_argument("--width", type=int, default=32, help="resnet: channels of the first stage")
    p.add_argument("--blocks", type=int, default=3, help="resnet: blocks per stage (3 stages)")
    p.add_argument("--hidden", type=int, default=256, help="mlp: width of every hidden layer")
    p.add_argument("--depth", type=int, default=36, help="mlp: hidden layers")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--quick", action="store_true", help="small and short: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.steps, args.warmup, args.repeats, args.depth, args.mlp_batch = 4, 1, 1, 16, 256
    args.kiln = os.path.abspath(args.kiln)  # the runs start in a scratch folder
    if not os.path.exists(args.kiln):
        sys.exit(f"no kiln binary at {args.kiln}; build it (scripts/build.sh) or pass --kiln")

    chosen = arms(args)
    references = [("a", "PyTorch BN + LeakyReLU", "resnet", args.batch),
                  ("b", "PyTorch none", "mlp", args.mlp_batch),
                  ("b", "PyTorch sqrt", "mlp-sqrt", args.mlp_batch)]
    results = {name: ([], []) for _, name, _ in chosen}
    results.update({name: ([], []) for _, name, _, _ in references})
    for _ in range(args.repeats):
        for _, name, arm in chosen:  # alternating: every repeat runs each arm once
            memory, time = run_arm(args, arm)
            results[name][0].append(memory)
            results[name][1].append(time)
        for _, name, arm, batch in references:
            time, memory = run_reference(args, arm, batch)
            results[name][1].append(time)
            if memory is not None:
                results[name][0].append(memory)

    device = cpu_name() if args.device == "cpu" else "cuda"
    print(f"# bench/memory.py on {device}, {args.threads} threads, {args.steps} steps "
          f"({args.warmup} warm-up), {args.repeats} runs per arm")
    print(f"# (a) resnet small preact, width {args.width}, {args.blocks} blocks x 3 stages, "
          f"3x32x32, batch {args.batch}; (b) mlp {args.depth} x {args.hidden} with norm layers, "
          f"1x28x28, batch {args.mlp_batch}")
    print(f"{'pair':<5}{'arm':<24}{'activation MiB':>20}{'step ms':>26}")
    rows = [(pair, name) for pair, name, _ in chosen] + [(p, n) for p, n, _, _ in references]
    for pair, name in sorted(rows, key=lambda r: r[0]):
        memory, time = results[name]
        shown = spread(memory) if memory else "-"
        print(f"{pair:<5}{name:<24}{shown:>20}{spread([t * 1e3 for t in time]):>26}")
    print()
    print(f"{'pair':<5}{'ratio':<36}{'memory':>8}{'time':>8}{'target':>22}")
    for pair, (base, test), target in (("a", ("BN + LeakyReLU", "InPlace-ABN"), "<= 0.70, <= 1.10"),
                                       ("b", ("checkpoint none", "checkpoint sqrt"),
                                        "<= 0.40, <= 1.40")):
        mem = statistics.median(results[test][0]) / statistics.median(results[base][0])
        time = statistics.median(results[test][1]) / statistics.median(results[base][1])
        print(f"{pair:<5}{test + ' / ' + base:<36}{mem:8.3f}{time:8.3f}{target:>22}")
    for pair, label, test, base in (
            ("a", "Kiln BN + LeakyReLU / PyTorch BN", "BN + LeakyReLU", "PyTorch BN + LeakyReLU"),
            ("a", "Kiln InPlace-ABN / PyTorch BN", "InPlace-ABN", "PyTorch BN + LeakyReLU"),
            ("b", "Kiln checkpoint none / PyTorch none", "checkpoint none", "PyTorch none"),
            ("b", "PyTorch sqrt / PyTorch none", "PyTorch sqrt", "PyTorch none")):
        # PyTorch's memory is counted on CUDA only (its caching allocator).
        mem = (f"{statistics.median(results[test][0]) / statistics.median(results[base][0]):8.3f}"
               if results[test][0] and results[base][0] else f"{'-':>8}")
        time = statistics.median(results[test][1]) / statistics.median(results[base][1])
        print(f"{pair:<5}{label:<36}{mem}{time:8.3f}{'reference':>22}")

if __name__ == "__main__":
    main()
