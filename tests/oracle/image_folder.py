"""The image_folder dataset's oracle: writes small image folders (JPEG and PNG; gray, RGB, RGBA,
palette, 16-bit, CMYK, progressive, interlaced; nested and linked sub-folders; upper-case
extensions) and what torchvision.datasets.ImageFolder and PIL make of them: classes, samples in
order with labels, each sample's pixels as Image.open(p).convert("RGB") and .convert("L"), and
JPEGs reduced by Image.draft. Usage: image_folder.py DIR (writes DIR/tree and DIR/manifest.json).
"""
import json
import os
import pathlib
import struct
import sys
import zlib

import numpy as np
from PIL import Image
from torchvision.datasets import DatasetFolder, ImageFolder

EXTENSIONS = (".jpg", ".jpeg", ".png")
out = pathlib.Path(sys.argv[1])
tree = out / "tree"
pixels_dir = out / "pixels"
pixels_dir.mkdir(parents=True, exist_ok=True)
rng = np.random.RandomState(26)


def smooth_rgb(h, w, seed):
    """A photo-like image (gradients and blobs, some noise) so JPEG's DCT has real work."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = np.random.RandomState(seed)
    img = np.zeros((h, w, 3))
    for c in range(3):
        for _ in range(4):
            cx, cy, s = r.uniform(0, w), r.uniform(0, h), r.uniform(0.1, 0.5) * max(h, w)
            img[..., c] += r.uniform(40, 120) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * s * s))
        img[..., c] += 60 * np.sin(x / r.uniform(3, 20)) * np.cos(y / r.uniform(3, 20))
    img += r.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_png_raw(path, array, bit_depth, color_type, interlace=False):
    """A PNG written by hand: 16-bit RGB and Adam7 interlacing, which PIL does not write."""
    h, w = array.shape[:2]
    dtype = ">u2" if bit_depth == 16 else np.uint8
    def rows_of(a):
        return b"".join(b"\x00" + a[i].astype(dtype).tobytes() for i in range(a.shape[0]))
    if interlace:
        passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
        raw = b"".join(rows_of(array[y0::dy, x0::dx]) for x0, y0, dx, dy in passes
                       if array[y0::dy, x0::dx].size)
    else:
        raw = rows_of(array)
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def make(path, kind, h, w, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = smooth_rgb(h, w, seed)
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    if kind == "jpeg":  # 4:2:0, quality 90
        Image.fromarray(rgb).save(path, "JPEG", quality=90)
    elif kind == "jpeg444":
        Image.fromarray(rgb).save(path, "JPEG", quality=95, subsampling=0)
    elif kind == "jpeg422":
        Image.fromarray(rgb).save(path, "JPEG", quality=75, subsampling=1)
    elif kind == "jpeg_progressive":
        Image.fromarray(rgb).save(path, "JPEG", quality=85, progressive=True)
    elif kind == "jpeg_long_header":  # a 40 kB comment: the header outgrows the probe's read
        Image.fromarray(rgb).save(path, "JPEG", quality=90, comment=b"k" * 40000)
    elif kind == "jpeg_gray":
        Image.fromarray(gray).save(path, "JPEG", quality=90)
    elif kind == "jpeg_cmyk":
        Image.fromarray(rgb).convert("CMYK").save(path, "JPEG", quality=90)
    elif kind == "png_rgb":
        Image.fromarray(rgb).save(path, "PNG")
    elif kind == "png_gray":
        Image.fromarray(gray).save(path, "PNG")
    elif kind == "png_rgba":
        alpha = rng.randint(0, 256, (h, w), dtype=np.uint8)
        Image.fromarray(np.dstack([rgb, alpha])).save(path, "PNG")
    elif kind == "png_gray_alpha":
        Image.fromarray(np.dstack([gray, gray[::-1]]), "LA").save(path, "PNG")
    elif kind == "png_palette":
        im = Image.fromarray(rgb).quantize(37)
        im.info["transparency"] = 3
        im.save(path, "PNG", transparency=3)
    elif kind == "png_1bit":
        Image.fromarray(gray > 128).save(path, "PNG")
    elif kind == "png_rgb16":
        write_png_raw(path, rgb.astype(np.uint16) * 257 + rng.randint(0, 257, rgb.shape), 16, 2)
    elif kind == "png_interlaced":
        write_png_raw(path, rgb, 8, 2, interlace=True)
    elif kind == "png_gray16":
        Image.fromarray(gray.astype(np.uint16) * 256 + 77).save(path, "PNG")
    else:
        raise ValueError(kind)


# ---- the folders ---------------------------------------------------------------------------
# Classes sort by code point: "Zebra" before "cat"; "cat"'s folders by whole path, so
# "cat/sub-x" comes before "cat/sub/deeper" ('-' < '/'), and "cat/linked" is a link followed.
LAYOUT = {
    "train": [
        ("Zebra/z1.jpg", "jpeg", 375, 500),
        ("Zebra/.hidden.jpeg", "jpeg444", 31, 17),
        ("Zebra/z2.png", "png_rgba", 20, 24),
        ("cat/a.jpg", "jpeg", 45, 67),
        ("cat/b.PNG", "png_rgb", 33, 40),
        ("cat/sub/c.jpeg", "jpeg_gray", 64, 48),
        ("cat/sub/deeper/d.png", "png_gray", 19, 23),
        ("cat/sub-x/e.JPG", "jpeg_progressive", 57, 73),
        ("cat/sub-x/f.Jpeg", "jpeg422", 40, 40),
        ("dog/cmyk.jpg", "jpeg_cmyk", 36, 52),
        ("dog/comment.jpg", "jpeg_long_header", 22, 27),
        ("dog/gray_alpha.png", "png_gray_alpha", 12, 9),
        ("dog/palette.png", "png_palette", 30, 26),
        ("dog/one_bit.png", "png_1bit", 17, 21),
        ("dog/rgb16.png", "png_rgb16", 14, 18),
        ("dog/interlaced.png", "png_interlaced", 29, 31),
    ],
    "val": [
        ("Zebra/v.jpg", "jpeg", 50, 60),
        ("cat/v.png", "png_gray", 10, 10),
        ("dog/x/v.jpeg", "jpeg_gray", 16, 24),
    ],
}
seed = 0
for split, files in LAYOUT.items():
    for rel, kind, h, w in files:
        seed += 1
        make(tree / split / rel, kind, h, w, seed)
# Files ImageFolder leaves out with these extensions: text, an image type not asked for.
(tree / "train/cat/notes.txt").write_text("not an image")
Image.fromarray(smooth_rgb(8, 8, 99)).save(tree / "train/dog/skipped.bmp")
# A linked folder outside the root, followed (os.walk(followlinks=True)).
make(tree / "outside/l.png", "png_rgb", 11, 13, 100)
os.symlink("../../outside", tree / "train/cat/linked")

# 16-bit gray: PIL reads it as mode I;16 and convert() clips at 255; the plugin takes the high
# byte, as libpng's strip_16 and PIL's 16-bit RGB do. Kept out of the equality checks.
make(tree / "gray16/only/g.png", "png_gray16", 10, 12, 101)

# ---- folders the plugin refuses or cannot decode ---------------------------------------------
bad = tree / "bad"
make(bad / "c/ok.jpg", "jpeg", 375, 500, 200)
jpeg = (bad / "c/ok.jpg").read_bytes()
(bad / "c/truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
(bad / "c/header.jpg").write_bytes(jpeg[:3] + rng.randint(0, 256, 200, dtype=np.uint8).tobytes())
(bad / "c/garbage.png").write_bytes(rng.randint(0, 256, 300, dtype=np.uint8).tobytes())
make(bad / "c/whole.png", "png_rgb", 40, 40, 201)
png = (bad / "c/whole.png").read_bytes()
(bad / "c/cut.png").write_bytes(png[: len(png) // 2])
corrupt = ["truncated.jpg", "header.jpg", "garbage.png", "cut.png"]
for name in corrupt:  # PIL refuses each of them too
    try:
        Image.open(bad / "c" / name).convert("RGB")
        raise SystemExit(f"PIL decoded {name}")
    except (OSError, SyntaxError):
        pass

(tree / "no_classes").mkdir()
(tree / "no_classes/loose.jpg").write_bytes(jpeg)
make(tree / "empty_class/full/x.png", "png_gray", 4, 4, 300)
(tree / "empty_class/hollow/deep").mkdir(parents=True)
(tree / "empty_class/hollow/readme.txt").write_text("no image")
for name in ("a", "b", "c"):
    make(tree / f"mismatch/train/{name}/x.png", "png_gray", 4, 4, 301)
for name in ("a", "c", "d"):
    make(tree / f"mismatch/val/{name}/x.png", "png_gray", 4, 4, 302)

# ---- what torchvision and PIL make of them ----------------------------------------------------
manifest = {"extensions": list(EXTENSIONS), "splits": {}, "corrupt": corrupt}
for split in ("train", "val"):
    # ImageFolder's own class with the plugin's default extensions (ImageFolder passes
    # IMG_EXTENSIONS to it; its constructor takes no extensions).
    ds = DatasetFolder(str(tree / split), loader=str, extensions=EXTENSIONS)
    samples = []
    for i, (path, label) in enumerate(ds.samples):
        im = Image.open(path)
        entry = {"path": path, "label": label, "format": im.format, "mode": im.mode,
                 "height": im.size[1], "width": im.size[0]}
        for mode in ("RGB", "L"):
            name = f"{split}_{i}_{mode}.bin"
            np.asarray(Image.open(path).convert(mode)).tofile(pixels_dir / name)
            entry[mode] = name
        if im.format == "JPEG":
            entry["draft"] = {}
            for d in (2, 4, 8):
                dr = Image.open(path)
                dr.draft("RGB", (dr.size[0] // d, dr.size[1] // d))
                w, h = dr.size
                assert (w, h) == (-(-im.size[0] // d), -(-im.size[1] // d)), (path, d, dr.size)
                rec = {"height": h, "width": w}
                for mode in ("RGB", "L"):
                    name = f"{split}_{i}_{mode}_d{d}.bin"
                    np.asarray(dr.convert(mode)).tofile(pixels_dir / name)
                    rec[mode] = name
                entry["draft"][str(d)] = rec
        samples.append(entry)
    manifest["splits"][split] = {"root": str(tree / split), "classes": ds.classes,
                                 "class_to_idx": ds.class_to_idx, "samples": samples}
# ImageFolder with every extension it knows: the .bmp the plugin leaves out (and warns about).
manifest["train_all_extensions"] = len(ImageFolder(str(tree / "train")).samples)
png_only = DatasetFolder(str(tree / "train"), loader=str, extensions=(".png",))
manifest["train_png_only"] = [[p, l] for p, l in png_only.samples]
g = np.asarray(Image.open(tree / "gray16/only/g.png"), dtype=np.uint16)
(g >> 8).astype(np.uint8).tofile(pixels_dir / "gray16_high_byte.bin")
manifest["gray16"] = {"root": str(tree / "gray16"), "height": g.shape[0], "width": g.shape[1],
                      "pil_L_max": int(np.asarray(Image.open(tree / "gray16/only/g.png").convert("L")).max())}
manifest["bad_root"] = str(bad)
(out / "manifest.json").write_text(json.dumps(manifest, indent=1))
