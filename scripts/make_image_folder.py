"""Writes a small image-classification folder in torchvision ImageFolder's layout, made from the
photos scikit-image ships, for configs/image_folder.toml and bench/data_loader.py:

    OUT/train/<class>/<n>.jpg    OUT/val/<class>/<n>.jpg

Each class is one photo (astronaut, coffee, chelsea, ...); each image a random crop of it, resized
to about ImageNet's typical 500 x 375 (either orientation), sometimes mirrored, its brightness
jittered, saved as JPEG at quality 90. Seeded: the same arguments write the same files.

    ~/.cache/kiln/venv/bin/python scripts/make_image_folder.py runs/image_folder_data \\
        --classes 8 --train 120 --val 30
"""

import argparse
import os

import numpy as np
from PIL import Image

PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field",
          "retina", "colorwheel", "camera", "brick", "grass", "gravel", "coins", "clock", "moon"]


def photo(name):
    import skimage.data
    a = getattr(skimage.data, name)()
    if a.ndim == 2:
        a = np.stack([a] * 3, axis=-1)
    return Image.fromarray(a[..., :3].astype(np.uint8))


def variant(img, rng):
    w, h = img.size
    side = rng.uniform(0.35, 1.0)
    cw, ch = max(32, int(w * side)), max(32, int(h * side * rng.uniform(0.75, 1.33)))
    cw, ch = min(cw, w), min(ch, h)
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    out = img.crop((x, y, x + cw, y + ch))
    size = (500, 375) if rng.random() < 0.7 else (375, 500)
    size = tuple(int(s * rng.uniform(0.85, 1.15)) for s in size)
    out = out.resize(size, Image.BILINEAR)
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    gain = rng.uniform(0.8, 1.2)
    arr = np.clip(np.asarray(out, np.float32) * gain, 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def write(out, classes, train, val, seed=0, quality=90):
    """Writes the folder unless it is complete already; returns (train root, val root)."""
    stamp = os.path.join(out, f".complete-{classes}-{train}-{val}-{seed}-{quality}")
    roots = os.path.join(out, "train"), os.path.join(out, "val")
    if os.path.exists(stamp):
        return roots
    rng = np.random.default_rng(seed)
    for name in PHOTOS[:classes]:
        img = photo(name)
        for root, count in zip(roots, (train, val)):
            folder = os.path.join(root, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                variant(img, rng).save(os.path.join(folder, f"{i:05d}.jpg"), quality=quality)
    open(stamp, "w").close()
    return roots


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="runs/image_folder_data")
    ap.add_argument("--classes", type=int, default=8, help=f"at most {len(PHOTOS)}")
    ap.add_argument("--train", type=int, default=120, help="training images per class")
    ap.add_argument("--val", type=int, default=30, help="validation images per class")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quality", type=int, default=90)
    args = ap.parse_args()
    if not 2 <= args.classes <= len(PHOTOS):
        ap.error(f"--classes must be in [2, {len(PHOTOS)}]")
    train, val = write(args.out, args.classes, args.train, args.val, args.seed, args.quality)
    print(f"wrote {args.classes} classes: {train} ({args.train} a class), {val} ({args.val} a class)")


if __name__ == "__main__":
    main()
