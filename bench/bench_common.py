"""What the bench scripts share: TOML for the Kiln pipelines they write, the CPU's name for the
machine line of their tables, and the verdict of their twin checks."""
import json
import os
import platform
import statistics
import subprocess
import sys

# torch.compile's modes, for the compiled arm of bench/train_throughput.py ("reduce-overhead" adds
# CUDA graphs, which a CPU model skips).
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


def compile_time(step_times, compiles, warmup):
    """A compiled twin's compile seconds: every warm-up step in which Dynamo compiled a graph (the
    first always does) less a steady step (the median measured step). `compiles`: graphs compiled
    so far, per step. Returns (compile_s, steady, late): late is the first measured step that
    compiled a graph (its compile time is inside the measurement), or None."""
    steady = statistics.median(step_times[warmup:])
    compiling = [i for i in range(warmup) if i == 0 or compiles[i] != compiles[i - 1]]
    late = next((i for i in range(max(warmup, 1), len(compiles))
                 if compiles[i] != compiles[i - 1]), None)
    return sum(step_times[i] - steady for i in compiling), steady, late


def toml_value(v):
    """A Python value as a TOML value (bool, number, string, list, inline table)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML for {v!r}")


def cpu_name():
    """The CPU model from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def to_toml(cfg):
    """A pipeline as TOML text: {section: {key: value}}; a non-empty dict of dicts becomes
    [section.key] sub-tables (e.g. optimizer.custom_keys)."""
    out = []
    for section, body in cfg.items():
        out.append(f"[{section}]")
        tables = []
        for k, v in body.items():
            if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
                tables.append((k, v))
            else:
                out.append(f"{k} = {toml_value(v)}")
        for k, v in tables:
            out.append(f"\n[{section}.{k}]")
            out += [f"{json.dumps(name)} = {toml_value(x)}" for name, x in v.items()]
        out.append("")
    return "\n".join(out)


def twin_verdict(bad, tolerance):
    """Prints the loud line of a failed twin check (`bad`: the rows whose first-step losses
    differ by more than `tolerance`, a text) to the table and to stderr; the exit status."""
    if not bad:
        return 0
    msg = (f"TWIN MISMATCH in {', '.join(bad)}: the first-step losses differ by more than "
           f"{tolerance}, so the arms do not train the same model on the same data; those rows "
           f"compare nothing.")
    print(f"\n**{msg}**")
    print(f"\n!!! {msg}", file=sys.stderr)
    return 1


def run_kiln_pipeline(kiln, cfg, init, steps, work):
    """`kiln run` of pipeline `cfg` (a dict) in folder `work`, its outputs there too, starting
    from the weights file `init`. Returns (the step records of its --metrics file, its log
    lines); raises unless it exited 0 after exactly `steps` steps."""
    path = os.path.join(work, "pipeline.toml")
    metrics = os.path.join(work, "kiln.jsonl")
    cfg = dict(cfg, run=dict(cfg["run"], output_dir=os.path.join(work, "out")),
               model=dict(cfg["model"], init=init))
    with open(path, "w") as f:
        f.write(to_toml(cfg))
    proc = subprocess.run([kiln, "run", path, "--metrics", metrics], cwd=work,
                          capture_output=True, text=True)
    records = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            records = [r for r in map(json.loads, f) if r.get("type") == "step"]
    log = (proc.stdout + proc.stderr).strip().splitlines()
    if proc.returncode != 0 or len(records) != steps:
        raise RuntimeError(f"kiln run {path} exited {proc.returncode} after {len(records)} of "
                           f"{steps} steps:\n" + "\n".join(log[-15:]))
    return records, log


def torch_build(args):
    """--python's torch version, whether `args.kiln` loads that torch's libtorch_cpu.so, the
    libtorch_cpu.so it does load, and --python's Python version."""
    probe = subprocess.run([args.python, "-c", "import os, platform, torch; "
                            "print(platform.python_version(), torch.__version__, "
                            "os.path.join(os.path.dirname(torch.__file__), 'lib'))"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit(f"{args.python} cannot import torch:\n{probe.stderr[-2000:]}")
    python, version, lib = probe.stdout.split()[-3:]
    ldd = subprocess.run(["ldd", args.kiln], capture_output=True, text=True).stdout
    linked = next((line.split("=>")[1].split()[0] for line in ldd.splitlines()
                   if line.strip().startswith("libtorch_cpu.so") and "=>" in line), None)
    same = linked is not None and os.path.realpath(linked) == os.path.realpath(
        os.path.join(lib, "libtorch_cpu.so"))
    return version, same, linked, python


def fmt_spread(values, spec, unit=""):
    """Median (min–max) of the values that are not None, "—" when none are."""
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    m = statistics.median(values)
    if len(values) == 1:
        return f"{m:{spec}}{unit}"
    return f"{m:{spec}}{unit} ({min(values):{spec}}–{max(values):{spec}})"
