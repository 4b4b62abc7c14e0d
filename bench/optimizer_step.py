"""One optimizer step over ResNet-50's parameters (161 tensors, 25,557,032 float32 values, CPU).

Compares, in one run with the arms alternating: Kiln's optimizer plugins as the engine runs them
(bench_optimizer_step: plugin loaded by the host, OptimizerAdapter, state in the host's
StateStore, the process set up as `kiln run` sets up its own: tuned heap, Kiln's CPU allocator;
--glibc-heap: without them), torch::optim in C++ (same binary, where it has the optimizer), and
the Python reference with foreach=True, fused=True (where it has one for the CPU) and the
per-parameter loop (foreach=False). The references: torch.optim for most; schedulefree's
SGDScheduleFree and AdamWScheduleFree (in train mode); pytorch_optimizer.Lookahead over
torch.optim.AdamW for "lookahead"; torch.optim.Muon (one path, per parameter) for "muon", which
steps matrices only and so gets ResNet-50's weights of two or more dimensions as matrices
(workload_for). Every arm gets the same thread count, a warm-up, then --reps repetitions, each
the mean over --steps steps (3, 9 and 5 by default; shorter for the optimizers with slow steps,
RUN_LENGTH, unless the flags say otherwise). The Python arms run under glibc's and c10's
defaults, as a Python user gets them; --torch-malloc kiln gives them glibc's thresholds of
`kiln run` (the script runs itself again with MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_
set), which leaves the host's own cost in the ratio.

  ~/.cache/kiln/venv/bin/python bench/optimizer_step.py --build-dir build/release
  ~/.cache/kiln/venv/bin/python bench/optimizer_step.py --optimizers nadam,radam,muon

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

# The same hyperparameters as bench/arms.cpp (its hyper()), as the reference's keyword arguments.
HYPER = {
    "sgd": dict(lr=0.01, momentum=0.9, weight_decay=1e-4),
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
    "lion": dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.01),
    # The built-in optimizers of ABI 1.14.
    "nadam": dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, momentum_decay=4e-3,
                  decoupled_weight_decay=False),
    "radam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                  decoupled_weight_decay=False),
    "adamax": dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
    "adagrad": dict(lr=0.01, lr_decay=0.0, weight_decay=1e-4, initial_accumulator_value=0.0,
                    eps=1e-10),
    "adadelta": dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=1e-4),
    "asgd": dict(lr=0.01, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=1e-4),
    "rprop": dict(lr=0.01, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0)),  # no weight decay
    "adafactor": dict(lr=0.01, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.01),
    "sgd_schedulefree": dict(lr=0.1, momentum=0.9, weight_decay=1e-4, warmup_steps=0, r=0.0,
                             weight_lr_power=2.0),
    "adamw_schedulefree": dict(lr=2.5e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                               warmup_steps=0, r=0.0, weight_lr_power=2.0),
    "muon": dict(lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
                 adjust_lr_fn=None),
    # Over torch.optim.AdamW with HYPER["adamw"].
    "lookahead": dict(k=5, alpha=0.5, pullback_momentum="none"),
}
ALL_OPTIMIZERS = list(HYPER)


def _schedulefree(cls_name, opt):
    def make(params, flags):
        import schedulefree
        o = getattr(schedulefree, cls_name)(params, **HYPER[opt], **flags)
        o.train()  # y is stepped in train mode, as Kiln's plugin steps it
        return o
    return make


def _lookahead(params, flags):
    import pytorch_optimizer
    return pytorch_optimizer.Lookahead(torch.optim.AdamW(params, **HYPER["adamw"], **flags),
                                       **HYPER["lookahead"])


def _torch(cls_name, opt):
    cls = getattr(torch.optim, cls_name)
    return f"torch.optim.{cls_name}", lambda params, flags: cls(params, **HYPER[opt], **flags)


FUSED = ("foreach", "fused", "loop")
FOREACH = ("foreach", "loop")
# The Python reference of each optimizer: (name for the notes, constructor(params, flags), its
# implementation switches: those that exist on the CPU; "only": one path, no switch (Muon's)).
REFERENCES = {
    "sgd": (*_torch("SGD", "sgd"), FUSED),
    "adamw": (*_torch("AdamW", "adamw"), FUSED),
    "nadam": (*_torch("NAdam", "nadam"), FOREACH),
    "radam": (*_torch("RAdam", "radam"), FOREACH),
    "adamax": (*_torch("Adamax", "adamax"), FOREACH),
    "adagrad": (*_torch("Adagrad", "adagrad"), FUSED),
    "adadelta": (*_torch("Adadelta", "adadelta"), FOREACH),
    "asgd": (*_torch("ASGD", "asgd"), FOREACH),
    "rprop": (*_torch("Rprop", "rprop"), FOREACH),
    "adafactor": (*_torch("Adafactor", "adafactor"), FOREACH),
    "sgd_schedulefree": ("schedulefree.SGDScheduleFree",
                         _schedulefree("SGDScheduleFree", "sgd_schedulefree"), FOREACH),
    "adamw_schedulefree": ("schedulefree.AdamWScheduleFree",
                           _schedulefree("AdamWScheduleFree", "adamw_schedulefree"), FOREACH),
    "muon": (*_torch("Muon", "muon"), ("only",)),
    "lookahead": ("pytorch_optimizer.Lookahead(torch.optim.AdamW)", _lookahead, FUSED),
}
# torch::optim in C++ (bench_optimizer_step's torch-cpp arms).
TORCH_CPP = ("sgd", "adamw", "adagrad")
# Where the table also holds Kiln to >= 2x the per-parameter loop (docs/benchmarks.md, Targets).
LOOP_TARGET = ("sgd", "adamw")
# Per-optimizer (warmup, reps, steps) where the defaults (3, 9, 5) would take too long (about 2 s
# a step for muon's Newton-Schulz matmuls, about 1 s for adafactor's norms over short last
# dimensions; rprop's masked writes and adadelta are slow under load); the --warmup, --reps and
# --steps flags, when given, hold for every optimizer.
RUN_LENGTH = {"muon": (1, 5, 1), "adafactor": (1, 5, 1), "rprop": (2, 5, 2), "adadelta": (2, 5, 2)}
DEFAULT_RUN_LENGTH = (3, 9, 5)


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


def workload_for(opt, workload):
    """The (init, grads) `opt` steps: ResNet-50's, but for "muon" (2-D parameters only) its
    weights of two or more dimensions as matrices, [out, in * kh * kw] (the same values; the
    C++ side's workload_for in bench/arms.cpp does the same)."""
    if opt != "muon":
        return workload
    init, grads = workload
    keep = [i for i, p in enumerate(init) if p.dim() >= 2]
    return ([init[i].reshape(init[i].shape[0], -1) for i in keep],
            [grads[i].reshape(grads[i].shape[0], -1) for i in keep])


# The glibc heap settings `kiln run` applies to itself (host/io/heap.cpp), for --torch-malloc kiln
# (as bench/train_throughput.py's).
KILN_HEAP = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}


class CppServer:
    """bench_optimizer_step, spoken to over its line protocol."""

    def __init__(self, binary, threads, plugin_dir, engine_heap=True):
        cmd = [binary, "--threads", str(threads)]
        if plugin_dir:
            cmd += ["--plugin-dir", plugin_dir]
        if not engine_heap:
            cmd += ["--tune-heap", "0", "--kiln-allocator", "0"]
        # Without the variables --torch-malloc kiln set for this process: the binary tunes its
        # own heap (its MALLOC_* would turn that off, with the same thresholds).
        env = {k: v for k, v in os.environ.items() if k not in KILN_HEAP}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, env=env)
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
        name = REFERENCES[optimizer][0]
        # torch.optim's own classes keep the labels of the first table (the optimizer column
        # says which class); the others name their package.
        package = ("torch.optim" if name.startswith("torch.optim.") and optimizer != "muon"
                   else name)
        self.label = {"foreach": f"{package} (Python), foreach=True",
                      "fused": f"{package} (Python), fused=True",
                      "loop": f"{package} (Python), per-parameter loop (foreach=False)",
                      "only": f"{package} (Python), per-parameter loop (its only path)"}[mode]
        self.is_torch, self.is_loop = True, mode in ("loop", "only")
        self.opt = None

    def setup(self):
        init, grads = self.workload
        params = []
        for p0, g in zip(init, grads):
            p = p0.clone().requires_grad_(True)
            # The arm's own gradients: schedulefree's optimizers write into p.grad (the weight
            # decay added, AdamW's normalised in place), which must not reach the other arms.
            p.grad = g.clone()
            params.append(p)
        flags = {} if self.mode == "only" else impl_flags(self.mode)
        name, make, _ = REFERENCES[self.optimizer]
        try:
            self.opt = make(params, flags)
            self.opt.step()  # fused support on CPU is only known once a step runs
        except (RuntimeError, ValueError, TypeError, ImportError) as e:
            self.opt = None
            return None, f"{self.label}: {str(e).splitlines()[0]}"
        hyper = dict(HYPER[self.optimizer])
        if self.optimizer == "lookahead":
            hyper["inner"] = HYPER["adamw"]
        return f"{name}({hyper}, {flags}); {len(params)} tensors", None

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
    ap.add_argument("--warmup", type=int,
                    help="warm-up steps per arm (default 3; RUN_LENGTH's for a few)")
    ap.add_argument("--reps", type=int,
                    help="measured repetitions per arm, >= 5 (default 9; RUN_LENGTH's for a few)")
    ap.add_argument("--steps", type=int,
                    help="steps per repetition, its mean (default 5; RUN_LENGTH's for a few)")
    ap.add_argument("--settle", type=float, default=0.1,
                    help="seconds of idle before each repetition, so the worker threads of the "
                         "process that ran before (spin-waiting OpenMP threads) are asleep")
    ap.add_argument("--glibc-heap", action="store_true",
                    help="run the C++ arms under glibc's and c10's defaults instead of the process "
                         "settings of `kiln run` (its tuned heap and CPU allocator)")
    ap.add_argument("--torch-malloc", default="default", choices=["default", "kiln"],
                    help="glibc heap of the Python arms: default = glibc's, as a Python user gets "
                         "it; kiln = the mmap/trim thresholds kiln run sets for itself")
    ap.add_argument("--optimizers", default="all",
                    help="comma-separated, of " + ",".join(ALL_OPTIMIZERS) + "; 'all': every one")
    args = ap.parse_args()
    if args.reps is not None and args.reps < 5:
        ap.error("--reps must be at least 5")
    if args.torch_malloc == "kiln" and any(os.environ.get(k) != v for k, v in KILN_HEAP.items()):
        # glibc reads them at start-up only.
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, **KILN_HEAP))
    python_heap = ("glibc's thresholds of `kiln run` (--torch-malloc kiln)"
                   if args.torch_malloc == "kiln" else "glibc's defaults")
    optimizers = ALL_OPTIMIZERS if args.optimizers == "all" else args.optimizers.split(",")
    unknown = [o for o in optimizers if o not in HYPER]
    if unknown:
        ap.error(f"unknown optimizer(s) {', '.join(unknown)}; known: {', '.join(ALL_OPTIMIZERS)}")

    def run_length(opt):
        defaults = RUN_LENGTH.get(opt, DEFAULT_RUN_LENGTH)
        given = (args.warmup, args.reps, args.steps)
        return tuple(d if g is None else g for g, d in zip(given, defaults))
    binary = args.binary or os.path.join(args.build_dir, "bench", "bench_optimizer_step")
    plugin_dir = args.plugin_dir or os.path.join(args.build_dir, "plugins")

    torch.set_num_threads(args.threads)
    server = CppServer(binary, args.threads, plugin_dir, engine_heap=not args.glibc_heap)
    shapes = resnet50_parameter_shapes()
    cpp_shapes = [(n, s) for n, s in server.hello["params"]]
    if cpp_shapes != shapes:
        sys.exit("bench_optimizer_step and this script disagree on ResNet-50's shapes")
    numel = sum(torch.Size(s).numel() for _, s in shapes)
    lengths = sorted({run_length(o) for o in optimizers})
    print(f"# {len(shapes)} tensors, {numel:,} parameters; threads: Python "
          f"{torch.get_num_threads()}, C++ {server.hello['threads']}; "
          + "; ".join(f"{w} warm-up steps, {r} repetitions x {n} steps per arm"
                      + (f" ({', '.join(o for o in optimizers if run_length(o) == (w, r, n))})"
                         if len(lengths) > 1 else "")
                      for w, r, n in lengths), flush=True)
    hello = server.hello
    print(f"# C++ arms' process: heap tuned as `kiln run` tunes it: "
          f"{'yes' if hello.get('tune_heap') else 'no'}; Kiln's CPU allocator: "
          f"{'yes' if hello.get('kiln_allocator') else 'no'}; Python arms: heap {python_heap}, "
          f"c10's CPU allocator", flush=True)
    for r in server.hello["refused"]:
        print(f"# plugin refused: {r}", flush=True)

    torch.manual_seed(0)
    workload = ([torch.randn(s) * 0.02 for _, s in shapes],
                [torch.randn(s) * 1e-3 for _, s in shapes])
    rows, notes = [], []
    for opt in optimizers:
        warmup, reps, steps = run_length(opt)
        work = workload_for(opt, workload)
        if work is not workload:
            notes.append(f"{opt}: {len(work[0])} matrices, "
                         f"{sum(p.numel() for p in work[0]):,} values (ResNet-50's weights of "
                         f"two or more dimensions as [out, in * kh * kw])")
        arms = [CppArm(server, f"kiln-{opt}", f"Kiln `{opt}` plugin (host adapter)", False)]
        if opt in TORCH_CPP:
            arms += [CppArm(server, f"torch-cpp-{opt}", "torch::optim (C++)", True)]
        if opt in REFERENCES:
            arms += [PyArm(opt, mode, work) for mode in REFERENCES[opt][2]]
        live = []
        for arm in arms:
            text, skip = arm.setup()
            if skip:
                notes.append(f"{opt}: skipped {arm.label}: {skip}")
                continue
            notes.append(f"{opt}: {arm.label}: {text}")
            live.append(arm)
        for arm in live:
            arm.run(warmup)
        samples = {arm.label: [] for arm in live}
        for rep in range(reps):
            # Rotate the order so no arm always follows the same neighbour.
            for arm in live[rep % len(live):] + live[:rep % len(live)]:
                time.sleep(args.settle)
                samples[arm.label].append(arm.run(steps))
            print(f"# {opt}: repetition {rep + 1}/{reps} done", flush=True)
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
    print("\nTargets (Kiln ≥ fastest PyTorch variant; for sgd and adamw also ≥ 2× the "
          "per-parameter loop):")
    for opt, label, m, lo, hi, vs_fast, vs_loop, is_torch in rows:
        if is_torch or vs_fast is None:
            continue
        fast_ok = vs_fast >= 1.0
        line = f"- {opt}: vs fastest PyTorch {ratio(vs_fast)} -> {'met' if fast_ok else 'NOT met'}"
        if opt in LOOP_TARGET:
            loop_ok = vs_loop is not None and vs_loop >= 2.0
            line += (f"; vs per-parameter loop {ratio(vs_loop)} -> "
                     f"{'met' if loop_ok else 'NOT met'}")
        print(line)
    print("\nNotes:")
    for n in notes:
        print(f"- {n}")


if __name__ == "__main__":
    main()
