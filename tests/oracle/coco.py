"""The coco dataset's oracle: writes a COCO annotation file over given images (image ids out of
order, category ids sparse and listed out of order, several annotations per image with boxes,
polygons, crowd flags and a repeated category, one image with none, keys COCO files carry that
the reader skips) and what torchvision.datasets.CocoDetection (pycocotools) makes of it: the
images in its order and each one's categories as a row over the categories in ascending id;
once with every image, once with the annotated ones only. Usage: coco.py DIR, with
DIR/config.json {"root": folder, "files": [paths relative to it]}; writes DIR/instances.json and
DIR/expected.json.
"""
import json
import os
import pathlib
import sys

import numpy as np
from torchvision.datasets import CocoDetection

out = pathlib.Path(sys.argv[1])
config = json.loads((out / "config.json").read_text())
rng = np.random.RandomState(28)

# Sparse ids, not in id order, as COCO's 80 categories run 1..90.
categories = [{"id": 18, "name": "dog", "supercategory": "animal"},
              {"id": 1, "name": "person", "supercategory": "person"},
              {"id": 3, "name": "car", "supercategory": "vehicle"},
              {"id": 44, "name": "bottle", "supercategory": "kitchen"}]
files = config["files"]
ids = rng.permutation(len(files)) * 7 + 100
images = [{"id": int(i), "file_name": f, "height": 10, "width": 10, "license": 1,
           "coco_url": "http://example/" + f} for i, f in zip(ids, files)]
annotations = []
for n, image in enumerate(images):
    if n == 1:
        continue  # an image with no annotation
    for _ in range(rng.randint(1, 5)):  # categories may repeat within an image
        c = categories[rng.randint(len(categories))]
        annotations.append({"id": len(annotations) + 1, "image_id": image["id"],
                            "category_id": c["id"], "iscrowd": int(rng.rand() < 0.2),
                            "area": 12.5, "bbox": [1.0, 2.0, 3.5, 4.0],
                            "segmentation": [[1.0, 2.0, 4.5, 2.0, 4.5, 6.0]]})
doc = {"info": {"description": "oracle", "year": 2026}, "licenses": [{"id": 1, "name": "x"}],
       "images": images, "annotations": annotations, "categories": categories}
(out / "instances.json").write_text(json.dumps(doc))

ds = CocoDetection(config["root"], str(out / "instances.json"))
column = {c: k for k, c in enumerate(sorted(ds.coco.getCatIds()))}
classes = [ds.coco.loadCats(c)[0]["name"] for c in sorted(ds.coco.getCatIds())]


def sample(index):
    image_id = ds.ids[index]
    row = [0] * len(column)
    for a in ds._load_target(image_id):
        row[column[a["category_id"]]] = 1
    path = os.path.join(ds.root, ds.coco.loadImgs(image_id)[0]["file_name"])  # as _load_image
    return {"path": path, "row": row,
            "annotated": len(ds.coco.getAnnIds(imgIds=image_id)) > 0}


keep = [sample(i) for i in range(len(ds))]
expected = {"classes": classes, "keep": keep, "skip": [s for s in keep if s["annotated"]]}
(out / "expected.json").write_text(json.dumps(expected))
