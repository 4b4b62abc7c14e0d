"""The image_list dataset's CSV oracle: Python's csv module writes a list whose paths and class
names need quoting (commas, quotes, a line break, spaces) and reads it back; the dataset must
read every record as csv.reader does. Usage: image_list_csv.py DIR, with DIR/config.json
{"root": folder, "files": [image paths relative to it]}. Writes DIR/images/ (links with awkward
names to those images), DIR/list.csv (csv.writer, default dialect, header path,classes, classes
joined by ";") and DIR/expected.json: per record, as csv.reader parses it, the path, the image it
links to and the classes (the second field split at ";", pieces stripped, empty ones dropped).
"""
import csv
import json
import os
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
config = json.loads((out / "config.json").read_text())
images = out / "images"
images.mkdir(exist_ok=True)
names = ['plain', 'a, comma', 'say "cheese"', 'two\nlines', ' spaced ', '"quoted", all']
classes = ["sky", "big, dog", 'the "cat"', "sky;dog"]

rows = []
for k, source in enumerate(config["files"]):
    ext = os.path.splitext(source)[1]
    name = f"{k:02d} {names[k % len(names)]}{ext}"
    link = images / name
    if not link.exists():
        link.symlink_to(os.path.join(config["root"], source))
    # Sample k: the classes of the bits of k + 1 over the first three; "sky;dog" is two classes.
    mine = [c for b, c in enumerate(classes[:3]) if ((k + 1) >> b) & 1]
    if k % 4 == 3:
        mine.append(classes[3])
    rows.append([name, ";".join(mine)])

with open(out / "list.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["path", "classes"])
    writer.writerows(rows)

expected = []
with open(out / "list.csv", newline="") as f:
    reader = csv.reader(f)
    next(reader)
    for record, source in zip(reader, config["files"]):
        split = [c.strip() for c in record[1].split(";")]
        expected.append({"path": record[0], "source": source,
                         "classes": [c for c in split if c]})
(out / "expected.json").write_text(json.dumps(expected))
