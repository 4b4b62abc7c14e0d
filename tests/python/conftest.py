"""Fixtures of the Python binding's pytest suite (tests/python): libkiln from KILN_LIBRARY, the
binding from the source tree, and small CPU pipelines as dicts that train in well under a
second (synthetic images, or tiny IDX files a test writes, with a torch twin of the model).

    KILN_LIBRARY=build/release/lib/libkiln.so python -m pytest -q tests/python
"""
import gzip
import os
import struct
import sys
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("KILN_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE_DIR / "bindings" / "python"))

import kiln  # noqa: E402

# 4 classes of 8 x 8 gray images; 256 training samples in batches of 64: 4 steps per epoch.
CLASSES = 4
SIZE = 8
STEPS_PER_EPOCH = 4


@pytest.fixture(scope="session", autouse=True)
def library():
    path = os.environ.get("KILN_LIBRARY")
    if not path:  # a failure, not a skip: a missing library must not pass as green
        raise RuntimeError("set KILN_LIBRARY to build/<preset>/lib/libkiln.so")
    return kiln.load(path)


def base_pipeline(out_dir, **sections):
    """A synthetic-data MLP pipeline as a dict; `sections` update its sections key by key."""
    d = {
        "run": {"device": "cpu", "epochs": 2, "seed": 3, "threads": 1, "checkpoints": False,
                "tensorboard": False, "output_dir": str(out_dir)},
        "data": {"dataset": "synthetic", "synthetic_train": 256, "synthetic_test": 128,
                 "synthetic_classes": CLASSES, "channels": 1, "height": SIZE, "width": SIZE,
                 "batch_size": 64, "workers": 1},
        "model": {"name": "mlp", "hidden": [16]},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
        "lr_policy": {"name": "constant"},
    }
    for name, values in sections.items():
        d.setdefault(name, {}).update(values)
    return d


@pytest.fixture
def pipeline(tmp_path):
    return base_pipeline(tmp_path / "runs")


@pytest.fixture
def session(pipeline):
    s = kiln.Session.from_dict(pipeline, name="small", log_level="warn")
    yield s
    s.close()


def _write_idx(path, array, magic):
    import numpy as np
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in array.shape:
            f.write(struct.pack(">I", d))
        f.write(array.astype(np.uint8).tobytes())


@pytest.fixture
def idx_data(tmp_path):
    """A tiny IDX dataset (MNIST's file names) under tmp_path/idx, and its test split as the
    float tensors Kiln's pipeline makes of it ((pixel / 255 - 0.5) / 0.25) with the labels."""
    import numpy as np
    torch = pytest.importorskip("torch")
    root = tmp_path / "idx"
    root.mkdir()
    rng = np.random.default_rng(5)
    splits = {}
    for prefix, n in (("train", 128), ("t10k", 96)):
        labels = rng.integers(0, CLASSES, n)
        base = (np.arange(SIZE * SIZE).reshape(SIZE, SIZE) * 7 % 255)[None]
        images = np.clip(base * (labels[:, None, None] + 1) / 4 + rng.integers(0, 60, (n, SIZE, SIZE)),
                         0, 255).astype(np.uint8)
        _write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images, 0x803)
        _write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels, 0x801)
        x = (torch.from_numpy(images).float().unsqueeze(1) / 255.0 - 0.5) / 0.25
        splits[prefix] = (x, torch.from_numpy(labels.astype(np.int64)))
    return root, splits["t10k"]


def idx_pipeline(out_dir, root, **sections):
    d = base_pipeline(out_dir, **sections)
    d["data"] = {"dataset": "idx", "root": str(root), "num_classes": CLASSES, "mean": [0.5],
                 "std": [0.25], "batch_size": 32, "eval_batch_size": 1000, "workers": 1,
                 "shuffle": False}
    return d
