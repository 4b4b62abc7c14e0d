"""One optimizer step over ResNet-50's parameters (161 tensors, 25,557,032 float32 values, CPU).

Compares, in one run with the arms alternating: Kiln's optimizer plugins as the engine runs them
(bench_optimizer_step: plugin loaded by the host, OptimizerAdapter, state in the host's
StateStore), torch::optim in C++ (same binary), and torch.optim in Python with foreach=True,
fused=True (where CPU supports it) and the per-parameter loop (foreach=False). Every arm gets the
same thread count, a warm-up, then --reps repetitions, each the mean over --steps steps.

  ~/.cache/kiln/venv/bin/python bench/optimizer_step.py --build-dir build/release

Prints a Markdown table: median ms/step, min-max over the repetitions, and speed relative to the
fastest PyTorch variant and to the per-parameter loop (baseline time / this time; >1 is faster).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from bench_common import cpu_name
from torch_optim import impl_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The same hyperparameters as bench/arms.cpp.
HYPER = {
    "sgd": dict(lr=0.01, momentum=0.9, weight_decay=1e-4),
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
    "lion": dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.01),
}
TORCH_CLASSES = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


def resnet50_parameter_shapes(num_classes=1000):
    """torchvision.models.resnet50's parameters, by name and shape, in its order."""
    out = [("conv1.weight", [64, 3, 7, 7]), ("bn1.weight", [64]), ("bn1.bias", [64])]
    inplanes = 64
    for layer, (blocks, planes) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512]), start=1):
        for b in range(blocks):
            p = f"layer{layer}.{b}."
            out += [(p + "conv1.weight", [planes, inplanes, 1, 1]),
                    (p + "bn1.weight", [planes]), (p + "bn1.bias", [planes]),
                    (p + "conv2.weight", [planes, planes, 3, 3]),
                    (p + "bn2.weight", [planes]), (p + "bn2.bias", [planes]),
                    (p + "conv3.weight", [planes * 4, planes, 1, 1]),
                    (p + "bn3.weight", [planes * 4]), (p + "bn3.bias", [planes * 4])]
            if b == 0:
                out += [(p + "downsample.0.weight", [planes * 4, inplanes, 1, 1]),
                        (p + "downsample.1.weight", [planes * 4]),
                        (p + "downsample.1.bias", [planes * 4])]
            inplanes = planes * 4
    return out + [("fc.weight", [num_classes, inplanes]), ("fc.bias", [num_classes])]


class CppServer:
    """bench_optimizer_step, spoken to over its line protocol."""

    def __init__(self, binary, threads, plugin_dir):
        cmd = [binary, "--threads", str(threads)]
        if plugin_dir:
            cmd += ["--plugin-dir", plugin_dir]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)
        self.hello = json.loads(self._read())

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench_optimizer_step exited (status {self.proc.wait()})")
        return line.rstrip("\n")

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if answer.startswith("error "):
            raise RuntimeError(f"bench_optimizer_step: {command}: {answer[6:]}")
        return answer

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()


class CppArm:
    def __init__(self, server, name, label, is_torch):
        self.server, self.name, self.label, self.is_torch = server, name, label, is_torch
        self.is_loop = False

    def setup(self):
        answer = self.server.ask(f"setup {self.name}")
        kind, _, text = answer.partition(" ")
        return (text, None) if kind == "ok" else (None, text)

    def run(self, steps):
        return float(self.server.ask(f"run {self.name} {steps}").split()[1])

    def free(self):
        self.server.ask(f"free {self.name}")


class PyArm:
    def __init__(self, optimizer, mode, workload):
        self.optimizer, self.mode, self.workload = optimizer, mode, workload
        self.label = {"foreach": "torch.optim (Python), foreach=True",
                      "fused": "torch.optim (Python), fused=True",
                      "loop": "torch.optim (Python), per-parameter loop (foreach=False)"}[mode]
        self.is_torch, self.is_loop = True, mode == "loop"
        self.opt = None

    def setup(self):
        init, grads = self.workload
        params = []
        for p0, g in zip(init, grads):
            p = p0.clone().requires_grad_(True)
            p.grad = g
            params.append(p)
        flags = impl_flags(self.mode)
        try:
            self.opt = TORCH_CLASSES[self.optimizer](params, **HYPER[self.optimizer], **flags)
            self.opt.step()  # fused support on CPU is only known once a step runs
        except (RuntimeError, ValueError, TypeError) as e:
            self.opt = None
            return None, f"{self.label}: {str(e).splitlines()[0]}"
        return f"{type(self.opt).__name__}({HYPER[self.optimizer]}, {flags})", None

    def run(self, steps):
        start = time.perf_counter()
        for _ in range(steps):
            self.opt.step()
        return (time.perf_counter() - start) * 1e3 / steps

    def free(self):
        self.opt = None


def machine():
    cpu = cpu_name()
    return (f"{cpu}, {os.cpu_count()} logical CPUs visible, torch {torch.__version__} "
            f"(CPU capability {torch.backends.cpu.get_cpu_capability()}), Python "
            f"{platform.python_version()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build", "release"),
                    help="build tree holding bench/bench_optimizer_step and plugins/")
    ap.add_argument("--binary", help="bench_optimizer_step (default: BUILD_DIR/bench/...)")
    ap.add_argument("--plugin-dir", help="Kiln plugin folder (default: BUILD_DIR/plugins)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads for every arm")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps per arm")
    ap.add_argument("--reps", type=int, default=9, help="measured repetitions per arm (>= 5)")
    ap.add_argument("--steps", type=int, default=5, help="steps per repetition (its mean)")
    ap.add_argument("--settle", type=float, default=0.1,
                    help="seconds of idle before each repetition, so the worker threads of the "
                         "process that ran before (spin-waiting OpenMP threads) are asleep")
    ap.add_argument("--optimizers", default="sgd,adamw,lion")
    args = ap.parse_args()
    if args.reps < 5:
        ap.error("--reps must be at least 5")
    binary = args.binary or os.path.join(args.build_dir, "bench", "bench_optimizer_step")
    plugin_dir = args.plugin_dir or os.path.join(args.build_dir, "plugins")

    torch.set_num_threads(args.threads)
    server = CppServer(binary, args.threads, plugin_dir)
    shapes = resnet50_parameter_shapes()
    cpp_shapes = [(n, s) for n, s in server.hello["params"]]
    if cpp_shapes != shapes:
        sys.exit("bench_optimizer_step and this script disagree on ResNet-50's shapes")
    numel = sum(torch.Size(s).numel() for _, s in shapes)
    print(f"# {len(shapes)} tensors, {numel:,} parameters; threads: Python "
          f"{torch.get_num_threads()}, C++ {server.hello['threads']}; {args.warmup} warm-up steps, "
          f"{args.reps} repetitions x {args.steps} steps per arm", flush=True)
    for r in server.hello["refused"]:
        print(f"# plugin refused: {r}", flush=True)

    torch.manual_seed(0)
    workload = ([torch.randn(s) * 0.02 for _, s in shapes],
                [torch.randn(s) * 1e-3 for _, s in shapes])
    rows, notes = [], []
    for opt in args.optimizers.split(","):
        arms = [CppArm(server, f"kiln-{opt}", f"Kiln `{opt}` plugin (host adapter)", False)]
        if opt in TORCH_CLASSES:
            arms += [CppArm(server, f"torch-cpp-{opt}", "torch::optim (C++)", True)]
            arms += [PyArm(opt, mode, workload) for mode in ("foreach", "fused", "loop")]
        live = []
        for arm in arms:
            text, skip = arm.setup()
            if skip:
                notes.append(f"{opt}: skipped {arm.label}: {skip}")
                continue
            notes.append(f"{opt}: {arm.label}: {text}")
            live.append(arm)
        for arm in live:
            arm.run(args.warmup)
        samples = {arm.label: [] for arm in live}
        for rep in range(args.reps):
            # Rotate the order so no arm always follows the same neighbour.
            for arm in live[rep % len(live):] + live[:rep % len(live)]:
                time.sleep(args.settle)
                samples[arm.label].append(arm.run(args.steps))
            print(f"# {opt}: repetition {rep + 1}/{args.reps} done", flush=True)
        medians = {label: statistics.median(v) for label, v in samples.items()}
        torch_times = [medians[a.label] for a in live if a.is_torch]
        fastest = min(torch_times) if torch_times else None
        loop = next((medians[a.label] for a in live if a.is_loop), None)
        for arm in live:
            m, v = medians[arm.label], samples[arm.label]
            rows.append((opt, arm.label, m, min(v), max(v),
                         fastest / m if fastest else None, loop / m if loop else None,
                         arm.is_torch))
        for arm in live:
            arm.free()
    server.close()

    def ratio(x):
        return "—" if x is None else f"{x:.2f}×"

    print(f"\nMachine: {machine()}\n")
    print("| optimizer | variant | median ms/step | min–max ms | speed vs fastest PyTorch "
          "| speed vs per-param loop |")
    print("|---|---|---:|---:|---:|---:|")
    for opt, label, m, lo, hi, vs_fast, vs_loop, _ in rows:
        print(f"| {opt} | {label} | {m:.1f} | {lo:.1f}–{hi:.1f} | {ratio(vs_fast)} "
              f"| {ratio(vs_loop)} |")
    print("\nSpeed = baseline median / this median (above 1 is faster than the baseline).")
    print("\nTargets (Kiln ≥ fastest PyTorch variant, ≥ 2× the per-parameter loop):")
    for opt, label, m, lo, hi, vs_fast, vs_loop, is_torch in rows:
        if is_torch or opt not in TORCH_CLASSES:
            continue
        fast_ok = vs_fast is not None and vs_fast >= 1.0
        loop_ok = vs_loop is not None and vs_loop >= 2.0
        print(f"- {opt}: vs fastest PyTorch {ratio(vs_fast)} -> {'met' if fast_ok else 'NOT met'}; "
              f"vs per-parameter loop {ratio(vs_loop)} -> {'met' if loop_ok else 'NOT met'}")
    print("\nNotes:")
    for n in notes:
        print(f"- {n}")


if __name__ == "__main__":
    main()
