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

Columns: instructions (Ir), L1 instruction-cache misses (I1mr), L1 data-cache read and write
misses (D1mr, D1mw), per step; Kiln ÷ bare loop of instructions and of all L1 misses (above 1:
Kiln does more). The simulated caches are callgrind's defaults for this CPU.

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

EVENTS = ("Ir", "I1mr", "D1mr", "D1mw")


def callgrind(cmd, out, cwd):
    """Runs `cmd` under callgrind (cache simulation on); returns {event: total}."""
    full = ["valgrind", "--tool=callgrind", "--cache-sim=yes", f"--callgrind-out-file={out}"]
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
    """{arm: {event: count per step}} for `case`."""
    a, b = args.steps
    work = os.path.join(tmp, case)
    os.makedirs(work)
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
    return {arm: {e: (counts[(arm, b)][e] - counts[(arm, a)][e]) / (b - a) for e in EVENTS}
            for arm in ("Kiln", "bare loop")}


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
    args = ap.parse_args()
    args.kiln = os.path.join(args.build_dir, "bin", "kiln")
    args.bare_bin = os.path.join(args.build_dir, "bench", "bench_bare_loop")
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

    with tempfile.TemporaryDirectory(prefix="kiln-step-instructions-") as tmp:
        results = {case: per_step(case, args, tmp) for case in cases}

    a, b = args.steps
    print(f"\nPer step (callgrind, cache simulation on; steps {b} minus steps {a}; 1 thread)\n")
    print("| case | arm | instructions | I1 misses | D1 read misses | D1 write misses |")
    print("|---|---|---:|---:|---:|---:|")
    for case, arms in results.items():
        for arm, c in arms.items():
            print(f"| {case} | {arm} | {c['Ir']:,.0f} | {c['I1mr']:,.0f} | {c['D1mr']:,.0f} | "
                  f"{c['D1mw']:,.0f} |")
    print("\n| case | Kiln ÷ bare loop, instructions | Kiln ÷ bare loop, L1 misses |")
    print("|---|---:|---:|")
    for case, arms in results.items():
        k, m = arms["Kiln"], arms["bare loop"]
        misses = [sum(x[e] for e in EVENTS[1:]) for x in (k, m)]
        print(f"| {case} | {k['Ir'] / m['Ir']:.4f} | {misses[0] / misses[1]:.4f} |")
    print(f"\nReproduce: `{sys.executable} bench/step_instructions.py --cases {args.cases} "
          f"--steps {a},{b}`")


if __name__ == "__main__":
    main()
