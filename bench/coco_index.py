"""Reading a COCO annotation file of COCO 2017's size: Kiln's coco dataset against pycocotools.

Writes (once, seeded) a synthetic instances file shaped like instances_train2017.json: 118,287
images, 860,001 annotations with a polygon each, 80 categories with ids up to 90, about 380 MB.
Then times, in the same run:
  - kiln: `kiln validate` of a pipeline whose training split is that file (one parse: Kiln's
    coco dataset builds its sample index), less the same command on a one-image file (the
    model, the plugins and torch's start-up);
  - pycocotools: `COCO(file)` (json.load and the index), as torchvision's CocoDetection builds it.
Each in a fresh process; wall time and the process's peak resident memory (for Kiln, above the
one-image run's). The file is mapped by Kiln, so its pages count in Kiln's resident memory.

  ~/.cache/kiln/venv/bin/python bench/coco_index.py              # about 3 minutes
  ~/.cache/kiln/venv/bin/python bench/coco_index.py --repeats 5 --dir /tmp/kiln_coco_bench
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parent.parent


def write_instances(path, images, annotations):
    rng = np.random.RandomState(2017)
    cats = [{"id": i, "name": f"c{i}", "supercategory": "s"} for i in range(1, 91) if i % 9][:80]
    imgs = [{"id": i + 1, "file_name": "img.jpg", "height": 480, "width": 640, "license": 1,
             "coco_url": "http://images.cocodataset.org/train2017/%012d.jpg" % i,
             "date_captured": "2013-11-14 11:18:45"} for i in range(images)]
    ids = [c["id"] for c in cats]
    image_of = rng.randint(1, images + 1, annotations)
    cat_of = rng.randint(0, len(ids), annotations)
    anns = []
    for a in range(annotations):
        poly = np.round(rng.uniform(0, 640, 2 * rng.randint(6, 30)), 2).tolist()
        anns.append({"segmentation": [poly], "area": 1234.5, "iscrowd": 0,
                     "image_id": int(image_of[a]), "bbox": [1.5, 2.5, 100.25, 80.0],
                     "category_id": ids[cat_of[a]], "id": a + 1})
    with open(path, "w") as f:
        json.dump({"info": {"description": "synthetic, COCO 2017's size"}, "licenses": [],
                   "images": imgs, "annotations": anns, "categories": cats}, f)


def pipeline(path, train):
    path.write_text(f"""[run]
device = "cpu"
epochs = 1
eval = false
[data]
dataset = "coco"
train = "{train}"
batch_size = 8
workers = 0
random_resized_crop = 32
[model]
name = "mlp"
[optimizer]
name = "sgd"
lr = 0.1
[lr_policy]
name = "constant"
[loss]
name = "bce_with_logits"
[precision]
name = "fp32"
""")


def timed(cmd):
    """Wall seconds and peak resident MiB of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    out = proc.stdout.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{out}")
    return seconds, usage.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/kiln_coco_bench", help="where the files go (kept)")
    ap.add_argument("--images", type=int, default=118287)
    ap.add_argument("--annotations", type=int, default=860001)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kiln", default=str(ROOT / "build/release/bin/kiln"))
    args = ap.parse_args()

    d = pathlib.Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((48, 48, 3), 128, np.uint8)).save(d / "img.jpg")
    big = d / f"instances_{args.images}_{args.annotations}.json"
    if not big.exists():
        print(f"# writing {big}", flush=True)
        write_instances(big, args.images, args.annotations)
    small = d / "instances_1.json"
    write_instances(small, 1, 1)
    pipeline(d / "big.toml", big)
    pipeline(d / "small.toml", small)

    rows = {"kiln": [], "kiln_base": [], "pycocotools": []}
    for r in range(args.repeats):
        rows["kiln_base"].append(timed([args.kiln, "validate", str(d / "small.toml")]))
        rows["kiln"].append(timed([args.kiln, "validate", str(d / "big.toml")]))
        rows["pycocotools"].append(timed(
            [sys.executable, "-c",
             "import sys; from pycocotools.coco import COCO; COCO(sys.argv[1])", str(big)]))
        print(f"# repeat {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s {v[-1][1]:.0f} MiB"
                                                 for k, v in rows.items()), flush=True)

    med = {k: (statistics.median(s for s, _ in v), statistics.median(m for _, m in v))
           for k, v in rows.items()}
    kiln_s = med["kiln"][0] - med["kiln_base"][0]
    kiln_mib = med["kiln"][1] - med["kiln_base"][1]
    py_base = timed([sys.executable, "-c", "import pycocotools.coco"])
    py_s = med["pycocotools"][0] - py_base[0]
    py_mib = med["pycocotools"][1] - py_base[1]
    size = big.stat().st_size / 2**20
    print(f"\nFile: {big.name}, {size:.0f} MiB, {args.images} images, {args.annotations} "
          f"annotations; {args.repeats} runs each, medians; start-up (one-image file for Kiln, "
          f"the import for pycocotools) subtracted.\n")
    print("| reader | seconds | MiB/s | peak resident MiB above start-up |")
    print("|---|---:|---:|---:|")
    print(f"| Kiln `coco` | {kiln_s:.2f} | {size / kiln_s:.0f} | {kiln_mib:.0f} |")
    print(f"| pycocotools `COCO()` | {py_s:.2f} | {size / py_s:.0f} | {py_mib:.0f} |")
    print(f"\nKiln ÷ pycocotools: {py_s / kiln_s:.2f}× as fast, {kiln_mib / py_mib:.2f}× the memory")


if __name__ == "__main__":
    main()
