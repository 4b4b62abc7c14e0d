#!/usr/bin/env python3
"""Kiln driven from Python without a TOML file or a plugin library: the pipeline is a dict, the
learning-rate policy a Python function, the metrics come as dicts from an iterator, and the
weights leave as torch tensors (no copy) and come back into a new session.

    python3 bindings/python/examples/python_api.py              # Fashion-MNIST, 2 epochs
    python3 bindings/python/examples/python_api.py --synthetic  # seconds, no dataset needed

With the wheel installed (`pip install kiln_train-*.whl`, docs/install.md) `import kiln` finds
everything; from a checkout set KILN_LIBRARY=build/release/lib/libkiln.so.
"""

import argparse
import math
import sys
import tempfile
from pathlib import Path

try:
    import kiln
except ImportError:  # run from a checkout: the package beside this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import kiln
from kiln import components


def cosine(iteration, schedule):
    """Cosine decay from base_lr to base_lr * floor over the steps after warm-up."""
    o = schedule.options
    span = max(schedule.max_iters - schedule.warmup_iters, 1)
    t = min(max(iteration - schedule.warmup_iters - 1, 0) / span, 1.0)
    return schedule.base_lr * (o["floor"] + (1 - o["floor"]) * 0.5 * (1 + math.cos(math.pi * t)))


def pipeline(args, out_dir):
    data = {"dataset": "fashion-mnist", "batch_size": 128, "workers": 2}
    if args.synthetic:
        data = {"dataset": "synthetic", "synthetic_train": 2048, "synthetic_test": 512,
                "channels": 1, "height": 28, "width": 28, "batch_size": 128, "workers": 1}
    return {
        "run": {"device": "cpu", "epochs": args.epochs, "seed": 1, "checkpoints": False,
                "tensorboard": False, "output_dir": out_dir},
        "data": data,
        "model": {"name": "mlp", "hidden": [256, 128]},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True},
        # The Python function below, registered as "py_cosine", after the host's linear warm-up.
        "lr_policy": {"name": "py_cosine", "floor": 0.05, "warmup": "linear",
                      "warmup_iters": 50},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", action="store_true", help="synthetic images, no dataset")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--library", help="path of libkiln (default: the bundled one, $KILN_LIBRARY)")
    args = ap.parse_args()
    if args.library:
        kiln.load(args.library)
    import torch  # noqa: F401  (state_dict() gives torch tensors: fail before training)

    policy = components.lr_policy("py_cosine", cosine, options={
        "floor": components.Option(0.0, min=0.0, max=1.0, doc="final lr / base lr")})
    with tempfile.TemporaryDirectory() as tmp:
        config = pipeline(args, tmp)
        with kiln.Session(config, components=[policy], log_level="warn") as s:
            every = max(s.progress().batches_per_epoch // 4, 1)
            for m in s.steps():  # one dict per optimizer step
                if m["step"] % every == 0:
                    print(f"step {m['step']:5d}  loss {m['loss']:.4f}  lr {m['lr']:.5f}")
                if s.progress().epoch_ended:
                    ev = s.evaluate()
                    print(f"epoch {ev.epoch}: test accuracy {ev.accuracy:.4f}")
            trained = s.evaluate()
            weights = s.state_dict()  # name -> torch.Tensor, aliasing Kiln's own (no copy)
            print(f"{len(weights)} tensors, e.g. head.weight {tuple(weights['head.weight'].shape)}"
                  f" {weights['head.weight'].dtype}")
            saved = {k: v.clone() for k, v in weights.items()}  # copies outlive the session

        # A new session, same pipeline, not trained: load the weights and evaluate.
        with kiln.Session(config, components=[policy], log_level="warn") as fresh:
            before = fresh.evaluate()
            fresh.load_state_dict(saved)
            after = fresh.evaluate()
    print(f"fresh session: accuracy {before.accuracy:.4f}, after load_state_dict "
          f"{after.accuracy:.4f} (trained {trained.accuracy:.4f})")
    if not math.isclose(after.loss, trained.loss, rel_tol=1e-6):
        sys.exit(f"loaded weights evaluate to loss {after.loss}, trained {trained.loss}")


if __name__ == "__main__":
    main()
