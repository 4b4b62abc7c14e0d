"""The host's per-step cost in counts that do not jitter: Kiln (`kiln run`) against the bare C++
loop (bench_bare_loop), under callgrind with its cache simulation.

Wall-clock ratios on a 2-core VM move by a few per cent from run to run (train_throughput.py);
the host's cost on a dispatch-bound model is of that order. Instructions and simulated L1 misses
per step are exact for a given build, so they show what a change to the host's hot path did,
and how much work the host adds to the same ATen ops.

Both arms run train_throughput.py's pipeline for the case (same model, initial weights, batch,
SGD, unshuffled Fashion-MNIST) with one intra-op thread (under valgrind the threads of a team
run one at a time, and a spinning OpenMP worker would be counted as work). Each arm runs twice,
for --steps A and B steps; per step = (count at B - count at A) / (B - A), which cancels the
start-up (plugin loading, data loading, the first step's allocations).

Columns, per step: instructions (Ir); L1 misses (instruction, data read, data write); L2
misses, with callgrind's last level simulated as this CPU's per-core L2 (read from sysfs; a VM
that reports a shared L3 of hundreds of MiB would otherwise show almost none); mispredicted
branches (conditional and indirect, callgrind's branch simulation). Then Kiln ÷ bare loop of
each (above 1: Kiln does more). `--keep DIR` keeps the callgrind files for callgrind_annotate.

What the simulation cannot see: the kernel. A system call in the step costs a dispatch-bound
step far more than its own instructions on this VM (docs/speed.md), and callgrind counts none
of it; `strace -c -f` on a run shows which ones a step makes.

  ~/.cache/kiln/venv/bin/python bench/step_instructions.py                 # tiny, about 5 min
  ~/.cache/kiln/venv/bin/python bench/step_instructions.py --cases cnn --steps 2,4

cnn is slow under the simulation: its 10-step runs had not finished after 20 minutes on the
2-core VM, so keep its step counts small.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import train_throughput as tt
from bench_common import to_toml

EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw", "Bcm", "Bim")
L1_MISSES = ("I1mr", "D1mr", "D1mw")
L2_MISSES = ("ILmr", "DLmr", "DLmw")
MISPREDICTS = ("Bcm", "Bim")


def l2_geometry():
    """`--LL=size,ways,line` for this CPU's level-2 cache (sysfs), or None where not listed.

    callgrind simulates two levels, L1 and a last level that defaults to the largest cache. On
    a VM that reports a shared L3 of hundreds of MiB, almost nothing misses there; simulating the
    per-core L2 as the last level counts what does leave the core.
    """
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(root)):
            d = os.path.join(root, index)
            if not index.startswith("index"):
                continue
            read = lambda name: open(os.path.join(d, name)).read().strip()  # noqa: E731
            if read("level") == "2" and read("type") in ("Unified", "Data"):
                size = read("size")
                kib = int(size[:-1]) * (1024 if size.endswith("M") else 1)
                return f"--LL={kib * 1024},{read('ways_of_associativity')}," \
                       f"{read('coherency_line_size')}"
    except (OSError, ValueError):
        return None
    return None


L2 = l2_geometry()


def callgrind(cmd, out, cwd):
    """Runs `cmd` under callgrind (cache simulation on); returns {event: total}."""
    full = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--branch-sim=yes",
            f"--callgrind-out-file={out}"] + ([L2] if L2 else [])
    proc = subprocess.run(full + cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    names, totals = None, None
    with open(out) as f:
        for line in f:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith("summary:"):
                totals = [int(x) for x in line.split()[1:]]
    if names is None or totals is None:
        raise RuntimeError(f"{out}: no events or summary line")
    return dict(zip(names, totals))


def syscalls(cmd, out, cwd):
    """Runs `cmd` under `strace -f -c`; returns {system call: calls} over all its threads."""
    proc = subprocess.run(["strace", "-f", "-c", "-o", out, "--"] + cmd, cwd=cwd,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    calls = {}
    with open(out) as f:
        for line in f:
            cols = line.split()
            # "% time seconds usecs/call calls [errors] syscall"; skip the header, rules, total.
            if len(cols) in (5, 6) and cols[3].isdigit() and cols[-1] != "total":
                calls[cols[-1]] = int(cols[3])
    return calls


def kiln_cmd(args, cfg, init, steps, work):
    cfg = dict(cfg, run=dict(cfg["run"], max_steps=steps, log_interval=steps,
                             output_dir=os.path.join(work, "out")),
               model=dict(cfg["model"], init=init))
    path = os.path.join(work, f"pipeline-{steps}.toml")
    with open(path, "w") as f:
        f.write(to_toml(cfg))
    return [args.kiln, "run", path, "--metrics", os.path.join(work, f"kiln-{steps}.jsonl")]


def bare_cmd(case, args, cfg, init, steps):
    opt, data = cfg["optimizer"], cfg["data"]
    cmd = [args.bare_bin, "--case", case, "--steps", str(steps), "--warmup", "0",
           "--threads", "1", "--batch", str(data["batch_size"]), "--init", init,
           "--data-root", data["root"], "--shuffle", "0", "--lr", repr(opt["lr"]),
           "--momentum", repr(opt.get("momentum", 0.0)),
           "--dampening", repr(opt.get("dampening", 0.0)),
           "--nesterov", "1" if opt.get("nesterov", False) else "0",
           "--weight-decay", repr(opt.get("weight_decay", 0.0))]
    if case == "tiny":
        return cmd + ["--hidden", ",".join(str(h) for h in cfg["model"]["hidden"])]
    return cmd + ["--width", str(cfg["model"]["width"]),
                  "--blocks", ",".join(str(b) for b in cfg["model"]["blocks"])]


def per_step(case, args, tmp):
    """({arm: {event: count per step}}, {arm: {system call: calls per step}} or None)."""
    a, b = args.steps
    work = os.path.join(tmp, case)
    os.makedirs(work, exist_ok=True)
    cfg = tt.pipeline(case, b, args)
    cfg["run"]["threads"] = 1
    init = tt.make_init(cfg, args, work)
    jobs = {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for n in (a, b):
            out = os.path.join(work, f"kiln-{n}.callgrind")
            jobs[("Kiln", n)] = pool.submit(callgrind, kiln_cmd(args, cfg, init, n, work), out,
                                            work)
            out = os.path.join(work, f"bare-{n}.callgrind")
            jobs[("bare loop", n)] = pool.submit(callgrind, bare_cmd(case, args, cfg, init, n),
                                                 out, work)
        counts = {key: job.result() for key, job in jobs.items()}
    arms = ("Kiln", "bare loop")
    events = {arm: {e: (counts[(arm, b)][e] - counts[(arm, a)][e]) / (b - a) for e in EVENTS}
              for arm in arms}
    if shutil.which("strace") is None:
        return events, None
    # The same runs without valgrind, under strace: what the kernel does for each step.
    calls = {}
    for n in (a, b):
        calls[("Kiln", n)] = syscalls(kiln_cmd(args, cfg, init, n, work),
                                      os.path.join(work, f"kiln-{n}.strace"), work)
        calls[("bare loop", n)] = syscalls(bare_cmd(case, args, cfg, init, n),
                                           os.path.join(work, f"bare-{n}.strace"), work)
    per = {}
    for arm in arms:
        names = set(calls[(arm, a)]) | set(calls[(arm, b)])
        per[arm] = {name: (calls[(arm, b)].get(name, 0) - calls[(arm, a)].get(name, 0)) / (b - a)
                    for name in names}
    return events, per


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="tiny", help="comma-separated: tiny, cnn")
    ap.add_argument("--steps", default="100,300",
                    help="the two step counts A,B whose difference is measured")
    ap.add_argument("--jobs", type=int, default=2, help="callgrind runs at a time")
    ap.add_argument("--build-dir", default=os.path.join(tt.REPO, "build", "release"))
    ap.add_argument("--python", default=sys.executable,
                    help="Python with torch, for the twin's initial weights")
    ap.add_argument("--data-root", default=tt.FMNIST)
    # The bare loop runs NCHW: Kiln in the same layout measures the host's work, not a layout's.
    ap.add_argument("--memory-format", default="contiguous",
                    choices=["auto", "contiguous", "channels_last"],
                    help="Kiln's model.memory_format (default contiguous, the bare loop's)")
    ap.add_argument("--keep", metavar="DIR",
                    help="keep the callgrind outputs in DIR (for callgrind_annotate)")
    args = ap.parse_args()
    args.kiln = os.path.abspath(os.path.join(args.build_dir, "bin", "kiln"))
    args.bare_bin = os.path.abspath(os.path.join(args.build_dir, "bench", "bench_bare_loop"))
    args.batch = None
    args.threads = 1
    args.steps = [int(x) for x in args.steps.split(",")]
    cases = args.cases.split(",")
    if len(args.steps) != 2 or not 0 < args.steps[0] < args.steps[1]:
        ap.error("--steps takes two counts A,B with 0 < A < B")
    if any(c not in tt.BARE_CASES for c in cases):
        ap.error(f"--cases: choose from {', '.join(tt.BARE_CASES)}")
    if shutil.which("valgrind") is None:
        sys.exit("step_instructions.py: valgrind is not installed (apt-get install valgrind)")
    for path in (args.kiln, args.bare_bin):
        if not os.path.exists(path):
            sys.exit(f"step_instructions.py: {path} not found (build first)")

    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        measured = {case: per_step(case, args, args.keep) for case in cases}
    else:
        with tempfile.TemporaryDirectory(prefix="kiln-step-instructions-") as tmp:
            measured = {case: per_step(case, args, tmp) for case in cases}
    results = {case: m[0] for case, m in measured.items()}

    a, b = args.steps
    total = lambda c, events: sum(c[e] for e in events)  # noqa: E731
    print(f"\nPer step (callgrind, cache and branch simulation on; steps {b} minus steps {a}; "
          f"1 thread; last level simulated as {L2 or 'callgrind default'})\n")
    print("| case | arm | instructions | L1 misses (I1, D1 read, D1 write) | L2 misses | "
          "mispredicted branches |")
    print("|---|---|---:|---:|---:|---:|")
    for case, arms in results.items():
        for arm, c in arms.items():
            print(f"| {case} | {arm} | {c['Ir']:,.0f} | {total(c, L1_MISSES):,.0f} "
                  f"({c['I1mr']:,.0f}, {c['D1mr']:,.0f}, {c['D1mw']:,.0f}) | "
                  f"{total(c, L2_MISSES):,.0f} | {total(c, MISPREDICTS):,.0f} |")
    print("\n| case | Kiln ÷ bare loop: instructions | L1 misses | L2 misses | mispredicted "
          "branches |")
    print("|---|---:|---:|---:|---:|")
    for case, arms in results.items():
        k, m = arms["Kiln"], arms["bare loop"]
        ratios = [k["Ir"] / m["Ir"]] + [total(k, ev) / max(total(m, ev), 1)
                                         for ev in (L1_MISSES, L2_MISSES, MISPREDICTS)]
        print("| " + case + " | " + " | ".join(f"{r:.4f}" for r in ratios) + " |")
    print("\n| case | arm | system calls per step | the calls (per step) |")
    print("|---|---|---:|---|")
    for case, (_, per) in measured.items():
        if per is None:
            print(f"| {case} | — | strace is not installed | |")
            continue
        for arm, calls in per.items():
            shown = sorted(((n, c) for n, c in calls.items() if abs(c) >= 0.005),
                           key=lambda item: -item[1])
            print(f"| {case} | {arm} | {sum(calls.values()):.3f} | "
                  + ", ".join(f"{n} {c:.3f}" for n, c in shown) + " |")
    print(f"\nReproduce: `{sys.executable} bench/step_instructions.py --cases {args.cases} "
          f"--steps {a},{b}`")


if __name__ == "__main__":
    main()
