"""Image folders from elsewhere, for the CLI's data tests (tests/cli/data_errors_test.cpp).

Writes into sys.argv[1]:
  bomb/c0/0_bomb.jpg   an 8x8 JPEG whose frame header claims 65000 x 65000 (~700 bytes), sorted
                       first, then good 8x8 PNGs (bomb/c0/a.png, b.png; bomb/c1/c.png, d.png)
  junk/c0/0_empty.jpg, 1_text.jpg, 2_gif.png, 3_webp.png
                       a zero-byte file, a text file and a GIF and a WEBP under the wrong
                       extension, sorted first, then good 8x8 PNGs as in bomb/
  sizes/c0/a.png 8x8, sizes/c1/b.png 12x9 (width x height)
and what PIL makes of them, in expected.json: which files PIL refuses to open as images, and
PIL's own verdict on the bomb (DecompressionBombError above twice Image.MAX_IMAGE_PIXELS).
"""
import io
import json
import pathlib
import sys

import numpy as np
from PIL import Image

out = pathlib.Path(sys.argv[1])
rng = np.random.RandomState(5)


def image(w, h):
    return Image.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def good_pngs(root):
    for name in ("c0/a.png", "c0/b.png", "c1/c.png", "c1/d.png"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        image(8, 8).save(root / name)


def bomb_jpeg():
    buffer = io.BytesIO()
    image(8, 8).save(buffer, "JPEG")
    data = bytearray(buffer.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = (65000).to_bytes(2, "big") * 2  # height, width
    return bytes(data)


good_pngs(out / "bomb")
(out / "bomb/c0/0_bomb.jpg").write_bytes(bomb_jpeg())

good_pngs(out / "junk")
(out / "junk/c0/0_empty.jpg").write_bytes(b"")
(out / "junk/c0/1_text.jpg").write_text("this is not an image\n")
image(8, 8).save(out / "junk/c0/2_gif.png", "GIF")
image(8, 8).save(out / "junk/c0/3_webp.png", "WEBP")

(out / "sizes/c0").mkdir(parents=True)
(out / "sizes/c1").mkdir(parents=True)
image(8, 8).save(out / "sizes/c0/a.png")
image(12, 9).save(out / "sizes/c1/b.png")

expected = {"unreadable": [], "bomb": None}
for name in ("0_empty.jpg", "1_text.jpg"):
    try:
        Image.open(out / "junk/c0" / name)
    except Exception as e:  # PIL's UnidentifiedImageError
        expected["unreadable"].append(f"{name}: {type(e).__name__}")
try:
    Image.open(out / "bomb/c0/0_bomb.jpg")
except Image.DecompressionBombError as e:
    expected["bomb"] = str(e)
(out / "expected.json").write_text(json.dumps(expected, indent=1))
