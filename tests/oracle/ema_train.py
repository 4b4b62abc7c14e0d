"""Oracle for [ema]: timm's ModelEmaV3 over the same weights as a `kiln run`.

Phase "prepare" writes a small IDX dataset (Fashion-MNIST's file names, 10 classes) and the
initial weights of the kiln mlp plugin's twin with batch norm after each hidden layer
(mlp.safetensors, Kiln's names).
Phase "average" replays the run: for every step t it loads the trained weights of the run's
checkpoint at step t into the twin and calls timm ModelEmaV3.update(twin, step=t), with
config["ema"]'s settings (decay, warmup, warmup_gamma, warmup_power, start_step as
update_after_step, buffers = "copy" as exclude_buffers). It writes to report.json the largest
difference between timm's average and the checkpoint's `ema/<name>` tensors over all steps and
tensors, the names either side lacks, the average's dtypes, and, at each evaluation of the
metrics file, the gap between that record and timm's average evaluated on the test split (top-1,
loss). With config["masters"] (a half model) the weights replayed are the checkpoint's fp32
masters (`master/<name>`) where it has them.
Phase "equal" compares two runs: the step losses of their metrics files and the tensors of
their final checkpoints (model.safetensors, and the `ema/` tensors of trainer.safetensors).
"""
import json
import os
import pathlib
import sys

import safetensors.torch
import torch
import torch.nn.functional as F

from common import (Mlp, Scratch, load_split, max_difference, read_metrics, save_state,
                    write_pattern_set)

# This folder's inplace_abn.py (another oracle) would shadow the package timm tries to import.
HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
from timm.utils.model_ema import ModelEmaV3  # noqa: E402

CLASSES = 10


def twin(cfg):
    return Mlp(cfg["size"] * cfg["size"], cfg["hidden"], CLASSES, norm_momentum=0.1)


def prepare(s, cfg):
    write_pattern_set(s.dir, cfg, noise=90, classes=CLASSES)
    torch.manual_seed(cfg["seed"])
    save_state(twin(cfg), os.path.join(s.dir, "mlp.safetensors"))


def checkpoint(root, step, part):
    return safetensors.torch.load_file(os.path.join(root, f"step-{step:09d}", part))


def averaged(trainer):
    return {k[len("ema/"):]: v for k, v in trainer.items() if k.startswith("ema/")}


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def average(s, cfg):
    torch.set_num_threads(1)
    e = cfg["ema"]
    model = twin(cfg)
    # Kiln's batch norm keeps no step counter: the twin's stays as it is, and is not compared.
    model.load_state_dict(safetensors.torch.load_file(os.path.join(s.dir, "mlp.safetensors")),
                          strict=False)
    ema = ModelEmaV3(model, decay=e["decay"], update_after_step=e.get("start_step", 0),
                     use_warmup=e.get("warmup", False), warmup_gamma=e.get("warmup_gamma", 1.0),
                     warmup_power=e.get("warmup_power", 2 / 3),
                     exclude_buffers=e.get("buffers", "average") == "copy")
    x_test, y_test = load_split(s.dir, "t10k", cfg["mean"], cfg["std"])
    _, evals = read_metrics(cfg["metrics"])
    evals = {r["step"]: r for r in evals}
    report = {"steps": 0, "max_abs": 0.0, "tensors": 0, "missing": [], "evals": 0,
              "eval_loss": 0.0, "accuracy": 0.0, "averaged_evals": 0}
    dtypes = set()
    for step in range(1, cfg["steps"] + 1):
        trained = checkpoint(cfg["checkpoints"], step, "model.safetensors")
        trainer = checkpoint(cfg["checkpoints"], step, "trainer.safetensors")
        if cfg.get("masters"):
            # A half model's optimizer steps fp32 masters: the average is theirs.
            trained.update({k[len("master/"):]: v for k, v in trainer.items()
                            if k.startswith("master/")})
        model.load_state_dict({k: v.float() for k, v in trained.items()}, strict=False)
        ema.update(model, step=step)
        got = averaged(trainer)
        dtypes |= {str(v.dtype) for v in got.values()}
        want = {k: v for k, v in ema.module.state_dict().items()
                if not k.endswith("num_batches_tracked")}
        report["missing"] += sorted(set(want) ^ set(got))
        report["max_abs"] = max(report["max_abs"],
                                max_difference(got, want, set(want) & set(got)))
        report["tensors"] = len(got)
        report["steps"] += 1
        if step in evals:
            with torch.no_grad():
                logits = ema.module(x_test)
                loss = F.cross_entropy(logits, y_test).item()
                accuracy = logits.argmax(1).eq(y_test).float().mean().item()
            record = evals[step]
            report["evals"] += 1
            report["averaged_evals"] += record.get("weights") == "ema"
            report["eval_loss"] = max(report["eval_loss"], relative(record["loss"], loss))
            report["accuracy"] = max(report["accuracy"], abs(record["accuracy"] - accuracy))
    report["dtypes"] = sorted(dtypes)
    (s.dir / "report.json").write_text(json.dumps(report))


def equal(s, cfg):
    runs = cfg["runs"]
    losses = [[r["loss"] for r in read_metrics(run["metrics"])[0]] for run in runs]
    report = {"steps": [len(x) for x in losses],
              "loss_gap": max((abs(a - b) for a, b in zip(*losses)), default=1e9)}
    for part, pick in (("model.safetensors", lambda t: t),
                       ("trainer.safetensors", averaged)):
        a, b = (pick(checkpoint(run["checkpoints"], cfg["step"], part)) for run in runs)
        key = "weights" if part == "model.safetensors" else "ema"
        report[key + "_tensors"] = [len(a), len(b)]
        common_names = set(a) & set(b)
        report[key + "_gap"] = max_difference(a, b, common_names) if common_names else 1e9
    (s.dir / "report.json").write_text(json.dumps(report))


def main():
    s = Scratch()
    cfg = s.config
    {"prepare": prepare, "average": average, "equal": equal}[cfg["phase"]](s, cfg)


if __name__ == "__main__":
    main()
