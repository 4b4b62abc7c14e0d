#!/usr/bin/env python3
"""Writes the seed corpora of the dataset readers' fuzz targets (tests/fuzz/corpus/{image,cifar,
image_list,coco,tensors}): a few small valid and near-valid inputs each, in the input format the
target's comment describes. Seeds only: reproducers of findings are added by hand (*_regression).

JPEGs need Pillow (the project's venv has it; otherwise any throwaway venv with Pillow):
    /root/.cache/kiln/venv/bin/python tests/fuzz/make_dataset_seeds.py
Pillow writes no interlaced PNG, so those are encoded here."""
import io
import json
import os
import struct
import sys
import zlib

from PIL import Image

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def pattern(width, height, channels, seed=0):
    return bytes((seed + 37 * x + 11 * y + 101 * c) & 0xFF
                 for y in range(height) for x in range(width) for c in range(channels))


# ---- image: one mode byte (bits 0-1: scale 1, 2, 4, 8; bit 2: gray), then the file ----------

def jpeg(mode, size, **options):
    channels = {"L": 1, "RGB": 3, "CMYK": 4}[mode]
    image = Image.frombytes(mode, size, pattern(size[0], size[1], channels))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=40, optimize=True, **options)
    return out.getvalue()


def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_adam7(width, height):
    """An 8-bit RGB PNG, Adam7-interlaced."""
    pixels = pattern(width, height, 3, seed=5)
    raw = b""
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
                           (1, 0, 2, 2), (0, 1, 1, 2)):
        xs = range(x0, width, dx)
        if not xs:
            continue
        for y in range(y0, height, dy):
            raw += b"\0" + b"".join(pixels[3 * (y * width + x):3 * (y * width + x) + 3] for x in xs)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) +
            png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b""))


def png(image, **options):
    out = io.BytesIO()
    image.save(out, "PNG", optimize=True, **options)
    return out.getvalue()


def jpeg_header_only(height, width):
    """A gray JPEG's markers up to its scan header, its frame claiming height x width."""
    data = bytearray(jpeg("L", (8, 8)))
    at = 2
    while True:
        marker = data[at + 1]
        length = struct.unpack(">H", data[at + 2:at + 4])[0]
        if marker == 0xC0:  # SOF0: precision, height, width
            data[at + 5:at + 9] = struct.pack(">HH", height, width)
        if marker == 0xDA:  # SOS: cut after its header
            return bytes(data[:at + 2 + length]) + b"\xff\xd9"
        at += 2 + length


def image_seeds():
    gray = 4
    write("image", "jpeg_gray.bin", bytes([0 | gray]) + jpeg("L", (17, 9)))
    write("image", "jpeg_rgb_420.bin", bytes([1]) + jpeg("RGB", (16, 16), subsampling=2))
    write("image", "jpeg_cmyk.bin", bytes([2]) + jpeg("CMYK", (9, 9)))
    write("image", "jpeg_progressive.bin",
          bytes([3 | gray]) + jpeg("RGB", (20, 12), progressive=True))
    rgb = jpeg("RGB", (24, 24), subsampling=0)
    write("image", "jpeg_truncated.bin", bytes([0]) + rgb[:len(rgb) * 3 // 4])
    write("image", "jpeg_header_only_65000.bin", bytes([0]) + jpeg_header_only(65000, 65000))
    write("image", "png_gray.bin", bytes([gray]) + png(Image.frombytes("L", (7, 5),
                                                                       pattern(7, 5, 1))))
    palette = Image.frombytes("P", (6, 6), bytes(k % 4 for k in range(36)))
    palette.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255])
    write("image", "png_palette_trns.bin", bytes([1]) + png(palette, transparency=2))
    write("image", "png_rgba.bin", bytes([2]) + png(Image.frombytes("RGBA", (5, 3),
                                                                    pattern(5, 3, 4))))
    gray16 = Image.frombytes("I;16", (5, 4), pattern(5, 4, 2))
    write("image", "png_gray16.bin", bytes([0]) + png(gray16))
    write("image", "png_rgb_interlaced.bin", bytes([3]) + png_adam7(10, 7))
    broken = bytearray(png_adam7(4, 4))
    broken[-20] ^= 0xFF  # inside IDAT: its CRC no longer matches
    write("image", "png_bad_crc.bin", bytes([gray]) + bytes(broken))
    huge = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 0x7FFFFFFF, 3, 8, 0,
                                                                  0, 0, 0))
    write("image", "png_huge_ihdr.bin", bytes([0]) + huge + png_chunk(b"IEND", b""))


# ---- cifar: a mode byte, a byte per file, then the files' bytes ------------------------------

def cifar_seeds():
    seeds = {
        "cifar10_test.bin": bytes([0x02, 0x01, 3]) + bytes(range(40)),
        "cifar10_train.bin": bytes([0x00, 0x01, 0x02, 0x01, 0x01, 0x01, 9, 1, 2, 3]),
        "cifar100_train_fine.bin": bytes([0x01, 0x02, 5, 99]) + bytes(range(200, 230)),
        "cifar100_test_coarse.bin": bytes([0x07, 0x01, 19, 0]),
        "cifar10_cut_after_create.bin": bytes([0x0A, 0x02, 7]),
        "cifar10_label_10.bin": bytes([0x02, 0x01, 10]),
        "cifar100_fine_label_100.bin": bytes([0x03, 0x01, 0, 100]),
        "cifar10_partial_record.bin": bytes([0x02, 0x11, 1]),
        "cifar10_short_record.bin": bytes([0x02, 0x21, 1]),
        "cifar10_missing_batch.bin": bytes([0x00, 0x01, 0x01, 0x04, 0x01, 0x01]),
        "cifar100_folder_in_place.bin": bytes([0x01, 0x08]),
        "cifar10_empty_file.bin": bytes([0x02, 0x00]),
    }
    for name, data in seeds.items():
        write("cifar", name, data)


# ---- tensors: a mode byte (bit 0 nchw, bit 1 val, bits 2-3 num_classes 0/1/10/256), the file --

FORMATS = {"U8": "B", "BOOL": "B", "I32": "i", "I64": "q", "F32": "f"}


def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, values) in data order."""
    header, data = {}, b""
    for name, dtype, shape, values in tensors:
        body = struct.pack("<%d%s" % (len(values), FORMATS[dtype]), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data),
                                                                         len(data) + len(body)]}
        data += body
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def tensors_seeds():
    def images(shape):
        count = 1
        for d in shape:
            count *= d
        return ("images", "U8", shape, list(pattern(count, 1, 1, seed=shape[0])))

    seeds = {
        "nhwc_i64.bin": (0x00, [images([2, 3, 2, 3]), ("labels", "I64", [2], [1, 4])]),
        "nchw_i32_10_classes.bin": (0x09, [("labels", "I32", [3], [0, 9, 5]),
                                           images([3, 3, 2, 2])]),
        "gray_u8_val.bin": (0x02, [images([2, 4, 3]), ("labels", "U8", [2], [0, 255])]),
        "multi_u8.bin": (0x00, [images([2, 2, 2, 1]), ("labels", "U8", [2, 3], [1, 0, 1, 0, 0, 0])]),
        "multi_bool_nchw.bin": (0x01, [images([2, 2, 1, 2]),
                                       ("labels", "BOOL", [2, 4], [0, 1, 1, 0, 1, 1, 1, 1])]),
        "multi_f32_1_class.bin": (0x04, [images([2, 1, 1, 1]), ("labels", "F32", [2, 1],
                                                                [0.25, 1.0])]),
        "metadata.bin": (0x00, [images([1, 1, 1]), ("labels", "I64", [1], [0])], {"a": "b"}),
        "label_10_of_10.bin": (0x08, [images([2, 1, 1, 3]), ("labels", "I64", [2], [3, 10])]),
        "negative_label.bin": (0x00, [images([1, 2, 2]), ("labels", "I32", [1], [-1])]),
        "multi_u8_value_2.bin": (0x00, [images([1, 1, 1, 1]), ("labels", "U8", [1, 2], [1, 2])]),
        "multi_f32_nan.bin": (0x00, [images([1, 1, 1, 1]),
                                     ("labels", "F32", [1, 2], [0.5, float("nan")])]),
        "images_f32.bin": (0x00, [("images", "F32", [1, 1, 1, 1], [0.5]),
                                  ("labels", "I64", [1], [0])]),
        "labels_wrong_length.bin": (0x00, [images([2, 1, 1]), ("labels", "U8", [3], [0, 1, 2])]),
        "no_labels.bin": (0x00, [images([2, 1, 1])]),
        "zero_height.bin": (0x00, [images([2, 0, 1, 3]), ("labels", "U8", [2], [0, 1])]),
    }
    for name, spec in seeds.items():
        mode, tensors = spec[0], spec[1]
        metadata = spec[2] if len(spec) > 2 else None
        write("tensors", name, bytes([mode]) + safetensors(tensors, metadata))


# ---- image_list: the CSV list --------------------------------------------------------------

def image_list_seeds():
    seeds = {
        "basic.csv": "path,classes\na.jpg,cat dog\nb/c.png,dog\n\nd.jpg,\n",
        "quoted.csv": 'path,classes\n"with, comma.jpg",cat\n"two\nlines.jpg",dog cat\n'
                      '"q""uote.jpg","bird"\n',
        "crlf.csv": 'path,classes\r\na.jpg,x y\r\n"b.jpg",z\r\n',
        "comma_classes.csv": "a.jpg,cat,dog\nb.jpg,dog\n/abs/c.jpg,  cat   bird  \n",
        "quoted_comma_classes.csv": 'a.jpg,"cat,dog"\nb.jpg,dog\n',
        "open_quote.csv": 'path,classes\n"a.jpg,cat\n',
        "text_after_quote.csv": 'path,classes\n"a.jpg"x,cat\n',
        "no_comma.csv": "path,classes\na.jpg cat\n",
        "empty_path.csv": "path,classes\n  ,cat\n",
        "header_only.csv": "path,classes\n",
        "no_class.csv": "path,classes\na.jpg,\nb.jpg, \n",
    }
    for name, text in seeds.items():
        write("image_list", name, text.encode())


# ---- coco: the annotation file ---------------------------------------------------------------

def coco_seeds():
    basic = {
        "info": {"year": 2017},
        "images": [{"id": 42, "file_name": "b.jpg", "width": 4, "height": 3},
                   {"id": 7, "file_name": "a.jpg"}, {"id": 9, "file_name": "sub/c.jpg"}],
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 18, "bbox": [0, 0, 1.5, 2],
             "segmentation": [[0, 0, 1, 1, 2, 0]], "iscrowd": 0},
            {"id": 2, "image_id": 42, "category_id": 1, "iscrowd": 1,
             "segmentation": {"counts": [1, 2, 3], "size": [3, 4]}},
            {"id": 3, "image_id": 7, "category_id": 1}],
        "categories": [{"id": 18, "name": "dog", "supercategory": "animal"},
                       {"id": 1, "name": "person"}],
    }
    seeds = {
        "basic.json": basic,
        "no_annotation.json": {"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [],
                               "categories": [{"id": 1, "name": "x"}]},
        "duplicate_image_id.json": {"images": [{"id": 1, "file_name": "a"},
                                               {"id": 1, "file_name": "b"}],
                                    "annotations": [], "categories": [{"id": 1, "name": "x"}]},
        "unknown_category.json": {"images": [{"id": 1, "file_name": "a"}],
                                  "annotations": [{"image_id": 1, "category_id": 2}],
                                  "categories": [{"id": 1, "name": "x"}]},
        "missing_file_name.json": {"images": [{"id": 1}], "annotations": [],
                                   "categories": [{"id": 1, "name": "x"}]},
        "element_not_object.json": {"images": [[{"id": 1, "file_name": "a"}], 3],
                                    "annotations": [], "categories": [{"id": 1, "name": "x"}]},
        "huge_ids.json": {"images": [{"id": 18446744073709551615, "file_name": "a"},
                                     {"id": -9223372036854775808, "file_name": "b"}],
                          "annotations": [], "categories": [{"id": 1.5, "name": "x"}]},
        "categories_only.json": {"categories": [{"id": 3, "name": "c"}, {"id": 3, "name": "d"}]},
    }
    for name, doc in seeds.items():
        write("coco", name, json.dumps(doc, separators=(",", ":")).encode())
    text = json.dumps(basic, separators=(",", ":")).encode()
    write("coco", "truncated.json", text[:len(text) // 2])
    write("coco", "not_an_object.json", b'[{"images":[]}]')
    write("coco", "sections_twice.json",
          b'{"categories":[{"id":1,"name":"x"}],"images":[{"id":1,"file_name":"a"}],'
          b'"annotations":[{"image_id":1,"category_id":1}],"images":5,"categories":[]}')


def main():
    image_seeds()
    cifar_seeds()
    tensors_seeds()
    image_list_seeds()
    coco_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
