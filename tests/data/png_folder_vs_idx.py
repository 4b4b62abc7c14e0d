"""png_folder_vs_idx.py KILN WORK [FASHION_MNIST_ROOT]: the image_folder dataset trains exactly as
the IDX files of the same images do.

Takes 1,200 training and 300 test images of Fashion-MNIST (or, without it, a synthetic stand-in of
the same shape), writes them as a PNG image folder (root/<class>/<index>.png, gray) and as IDX
files holding the same samples in the folder's order (class by class, by file name), trains the
same small pipeline on each with shuffle off and no augmentation, and requires equal per-step
losses, to the bit, and equal evaluation metrics. Exit 0 on success. (Unshuffled, the batches
hold one or two classes each, hence the small learning rate.)"""

import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
from PIL import Image

KILN, WORK = sys.argv[1], sys.argv[2]
ROOT = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
TRAIN, TEST, CLASSES = 1200, 300, 10


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def source(split, count):
    prefix = "train" if split == "train" else "t10k"
    images = os.path.join(ROOT, f"{prefix}-images-idx3-ubyte.gz")
    if os.path.exists(images):
        x = read_idx(images)[:count]
        y = read_idx(os.path.join(ROOT, f"{prefix}-labels-idx1-ubyte.gz"))[:count]
        return x, y.astype(np.int64)
    rng = np.random.default_rng(0 if split == "train" else 1)
    y = rng.integers(0, CLASSES, count)
    x = (rng.integers(0, 60, (count, 28, 28)) + 19 * y[:, None, None]).astype(np.uint8)
    return x, y


def write_idx(path, array):
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(">" + "I" * array.ndim,
                                                                     *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + np.ascontiguousarray(array, np.uint8).tobytes())


def write_split(split, count, folder, idx_dir):
    x, y = source(split, count)
    files = []
    for i, (image, label) in enumerate(zip(x, y)):
        # Class folders "c0".."c9" sort as 0..9; zero-padded names keep the file order.
        d = os.path.join(folder, f"c{label}")
        os.makedirs(d, exist_ok=True)
        name = os.path.join(d, f"{i:06d}.png")
        Image.fromarray(image, mode="L").save(name)
        files.append((f"c{label}", f"{i:06d}.png", i))
    order = [i for _, _, i in sorted(files)]  # torchvision ImageFolder's sample order
    prefix = "train" if split == "train" else "t10k"
    write_idx(os.path.join(idx_dir, f"{prefix}-images-idx3-ubyte.gz"), x[order])
    write_idx(os.path.join(idx_dir, f"{prefix}-labels-idx1-ubyte.gz"), y[order].astype(np.uint8))


PIPELINE = """
[run]
device = "cpu"
epochs = 2
seed = 3
threads = 1
log_interval = 1
checkpoints = false
tensorboard = false
output_dir = "{out}"

[data]
{data}
batch_size = 64
eval_batch_size = 100
workers = 2
shuffle = false
mean = [0.286]
std = [0.353]

[model]
name = "mlp"
hidden = [32]

[optimizer]
name = "sgd"
lr = 0.01

[lr_policy]
name = "constant"
"""


def run(name, data):
    path = os.path.join(WORK, name + ".toml")
    metrics = os.path.join(WORK, name + ".jsonl")
    with open(path, "w") as f:
        f.write(PIPELINE.format(out=os.path.join(WORK, name), data=data))
    proc = subprocess.run([KILN, "run", path, "--metrics", metrics], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        sys.exit(f"kiln run {path} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    with open(metrics) as f:
        records = [json.loads(line) for line in f]
    steps = [(r["step"], r["loss"]) for r in records if r.get("type") == "step"]
    evals = [(r.get("accuracy"), r.get("loss")) for r in records if r.get("type") == "eval"]
    return steps, evals


def main():
    folder, val_folder = os.path.join(WORK, "train"), os.path.join(WORK, "val")
    idx_dir = os.path.join(WORK, "idx")
    os.makedirs(idx_dir, exist_ok=True)
    write_split("train", TRAIN, folder, idx_dir)
    write_split("test", TEST, val_folder, idx_dir)
    idx_steps, idx_evals = run("idx", f'dataset = "idx"\nroot = "{idx_dir}"')
    png_steps, png_evals = run(
        "png", f'dataset = "image_folder"\nroot = "{folder}"\nval_root = "{val_folder}"\n'
        'color = "gray"')
    if len(idx_steps) != 2 * (TRAIN // 64 + (TRAIN % 64 > 0)):
        sys.exit(f"unexpected step count {len(idx_steps)}")
    if idx_steps != png_steps:
        bad = next(i for i, (a, b) in enumerate(zip(idx_steps, png_steps)) if a != b)
        sys.exit(f"step losses differ from step {idx_steps[bad][0]}: idx {idx_steps[bad][1]!r}, "
                 f"image folder {png_steps[bad][1]!r}")
    if idx_evals != png_evals or not idx_evals:
        sys.exit(f"evaluations differ: idx {idx_evals}, image folder {png_evals}")
    print(f"ok: {len(idx_steps)} steps and {len(idx_evals)} evaluations equal "
          f"(last loss {idx_steps[-1][1]})")


main()
