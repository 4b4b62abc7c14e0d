"""Images/s of the training data path on the CPU: torchvision vs NVIDIA DALI (CPU) vs Kiln.

What is measured: JPEG files from disk to a float batch in hand, through the ImageNet training
augmentation: decode, RandomResizedCrop(224) (scale 0.08-1, ratio 3/4-4/3, bilinear with
antialiasing), random horizontal flip, x / 255, minus ImageNet mean, over ImageNet std, batched
as N x 3 x 224 x 224 float32 with the labels. Issue 26's targets: Kiln ÷ torchvision >= 2x and
Kiln ÷ DALI >= 1x at the same number of workers.

The data: an ImageNet-layout folder (root/<class>/<file>.jpg) written once by this script and
cached under --data (default ~/.cache/kiln/bench-jpeg: the images in its train/, beside them a
manifest of the parameters they were made with, so a rerun with the same --images and --seed
skips the generation). --images JPEGs (default 4000) in 10 classes, one per real photo that
scikit-image ships (astronaut, coffee, chelsea, rocket, immunohistochemistry, hubble_deep_field,
the two stereo_motorcycle views, retina, camera; the next of grass, brick, gravel, clock stands
in for any that cannot be loaded): each file is a
seeded random crop (a quarter to all of the photo's area, at the target's aspect) of its class's
photo, randomly mirrored and brightened, resized (Lanczos) to an ImageNet-typical size (500 x 375
mostly; also 500 x 333, 375 x 500, 500 x 500 and smaller 4:3) and saved by PIL at quality 90
(4:2:0 chroma, as most of ImageNet). The table's header gives the mean file size and resolution:
about 46 KiB at 473 x 383 with the defaults, where ImageNet's training JPEGs average about
110 KiB (some 140 GB in 1.28 M files) at about 469 x 387. These photos are cleaner
(scikit-image's are downscaled, some of them upscaled again here), so fewer coefficients to
entropy-decode: absolute images/s run higher than on ImageNet for every arm; the ratios are
what the bench is for.

The arms, each a fresh process per run (this script with --one ARM), given the same folder,
batch (--batch, default 64) and worker count:
  torchvision  datasets.ImageFolder (PIL decode) + transforms.Compose([RandomResizedCrop(224),
               RandomHorizontalFlip(), ToTensor(), Normalize(ImageNet mean, std)]) +
               DataLoader(batch_size, num_workers = workers, shuffle = True, drop_last = True,
               persistent_workers = False; pin_memory off: nothing goes to a GPU). Workers are
               processes (workers = 0 would decode on the main thread).
  DALI         NVIDIA DALI's CPU-only pipeline (device_id = None, num_threads = workers):
               fn.readers.file(random_shuffle: a 1024-file shuffle buffer, not a permutation
               of the epoch) + fn.decoders.image_random_crop(device "cpu",
               the same scale/ratio ranges; DALI decodes only the crop's region) +
               fn.resize(224 x 224, linear, antialiased) + fn.crop_mirror_normalize(float, CHW,
               mirror = coin_flip) and a copy of the batch into a torch tensor. DALI comes from
               PyPI (nvidia-dali-cuda120, installed with --install-dali into --dali-path, kept
               out of the venv: its wheel brings its own numpy); where it cannot be imported or
               cannot run without a GPU the table says so, and why, instead of a row.
  Kiln         `kiln loader-bench PIPELINE.toml --batches N --warmup W`: the pipeline's training
               loader (its [data] section only: dataset "image_folder", root, batch_size,
               workers, shuffle, random_resized_crop = 224, random_flip, ImageNet mean/std,
               decode_scale) iterated N batches after W, one JSON line back. Two rows:
               decode_scale "auto" (libjpeg-turbo's DCT scaling where the crop allows it) and
               "full" (every JPEG decoded at full size, as the others do). Kiln's workers are
               threads of one process. Where the build has no `kiln loader-bench` the table
               says so and the other arms still run.

Timing, per run: first batch s = from creating the loader (torchvision: DataLoader(...), the
ImageFolder scan before it, also printed; DALI: defining and building the pipeline, its folder
scan included; Kiln: its own first_batch_s) to the first batch in hand; then the first --warmup
batches (the first one among them) are dropped and images/s = batch x --batches / the time from
the last warm-up batch in hand to the last measured batch in hand. The default --images 4000
gives 62 batches of 64 per epoch, more than --warmup + --batches, so no run crosses an epoch
boundary (a run that would is flagged: torchvision restarts its workers then). Per workers value
every arm runs --repeats times, the order of the arms reversed every repetition; the table gives
median (min-max) over the runs, the ratios are medians (min-max) of the per-repetition ratios.
Processes share 2 cores here with whatever else runs: the load average at the start and end is
printed with the table, and the bench waits for the 1-minute load to fall below --max-load first.

--train: a short `kiln run` on the same folder (resnet depth 18, 224-pixel crops, SGD, fp32,
--train-steps steps, batch --train-batch, data.workers = --train-workers) and its per-step
data_time (waiting for the loader) against step_time (forward, backward, optimizer) from
`kiln run --metrics`: whether the loader keeps a CPU training step fed. It needs the
image_folder dataset in the build; without it the bench prints what kiln said.

  # the table (a few minutes on 2 cores):
  ~/.cache/kiln/venv/bin/python bench/data_loader.py --install-dali
  # quick: one repetition, few batches
  ~/.cache/kiln/venv/bin/python bench/data_loader.py --repeats 1 --batches 10 --warmup 2
  # the training note
  ~/.cache/kiln/venv/bin/python bench/data_loader.py --train --arms none
"""
import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_common import cpu_name, fmt_spread, run_kiln_pipeline, to_toml  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
CROP = 224
DATA_VERSION = 2  # bump when the generator changes: cached folders of another version are redone
# The class photos in order of preference; the first 10 that load are the classes.
PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
          "hubble_deep_field", "motorcycle_left", "motorcycle_right", "retina", "camera",
          "grass", "brick", "gravel", "clock"]
CLASSES = 10
# (width, height, weight): ImageNet's common sizes; None = 4:3 with a random width 300-500.
SIZES = [(500, 375, 50), (500, 333, 20), (375, 500, 15), (500, 500, 5), (None, None, 10)]
ARMS = ["torchvision", "dali", "kiln"]
DALI_WHEEL = "nvidia-dali-cuda120"


# ---- the data ----------------------------------------------------------------------------------


def load_photo(name):
    import numpy as np
    import skimage.data
    if name.startswith("motorcycle_"):
        left, right, _ = skimage.data.stereo_motorcycle()
        img = left if name.endswith("left") else right
    else:
        img = getattr(skimage.data, name)()
    img = np.asarray(img)
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    return img[..., :3].astype(np.uint8)


def photos():
    out = []
    for name in PHOTOS:
        try:
            out.append((name, load_photo(name)))
        except Exception as e:  # a photo scikit-image would have to download: take the next
            print(f"# skimage.data.{name} unavailable ({type(e).__name__}); next photo",
                  file=sys.stderr)
        if len(out) == CLASSES:
            return out
    raise SystemExit(f"only {len(out)} of scikit-image's photos load; need {CLASSES}")


def target_size(rng):
    r = rng.uniform(0, sum(s[2] for s in SIZES))
    for w, h, weight in SIZES:
        if r < weight:
            if w is None:
                w = int(rng.integers(300, 501))
                h = w * 3 // 4
            return w, h
        r -= weight
    return SIZES[0][:2]


def make_jpeg(photo, rng):
    """A random crop of `photo` at an ImageNet-typical size, as a PIL image."""
    import numpy as np
    from PIL import Image
    w, h = target_size(rng)
    ph, pw = photo.shape[:2]
    area = rng.uniform(0.25, 1.0) * ph * pw
    cw = min(pw, int(round((area * w / h) ** 0.5)))
    ch = min(ph, int(round(cw * h / w)))
    cw = min(cw, int(round(ch * w / h)))
    x = int(rng.integers(0, pw - cw + 1))
    y = int(rng.integers(0, ph - ch + 1))
    crop = photo[y:y + ch, x:x + cw].astype(np.float32) * rng.uniform(0.8, 1.2)
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    img = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8))
    return img.resize((w, h), Image.LANCZOS)


def make_dataset(args):
    """The cached folder, made if missing or made with other parameters; its manifest."""
    import numpy as np
    manifest_path = os.path.join(args.data, "manifest.json")
    want = {"version": DATA_VERSION, "images": args.images, "seed": args.seed,
            "classes": CLASSES, "quality": 90}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if all(manifest.get(k) == v for k, v in want.items()):
            return manifest
        print(f"# {args.data} was made with other parameters: writing it anew", file=sys.stderr)
    started = time.perf_counter()
    parent = os.path.dirname(os.path.abspath(args.data))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".bench-jpeg-", dir=parent)
    rng = np.random.default_rng(args.seed)
    sizes, widths, heights, names = [], [], [], []
    for c, (name, photo) in enumerate(photos()):
        names.append(name)
        folder = os.path.join(tmp, "train", f"{c:02d}_{name}")
        os.makedirs(folder)
        for i in range(c, args.images, CLASSES):
            img = make_jpeg(photo, rng)
            path = os.path.join(folder, f"{i:06d}.jpg")
            img.save(path, "JPEG", quality=90)
            sizes.append(os.path.getsize(path))
            widths.append(img.width)
            heights.append(img.height)
    manifest = dict(want, photos=names, mean_bytes=statistics.mean(sizes),
                    mean_width=statistics.mean(widths), mean_height=statistics.mean(heights),
                    min_bytes=min(sizes), max_bytes=max(sizes))
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    # Swap the finished folder in whole, so an interrupted generation never looks complete.
    if os.path.exists(args.data):
        shutil.rmtree(args.data)
    os.rename(tmp, args.data)
    print(f"# wrote {args.images} JPEGs to {args.data} in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    return manifest


def image_root(args):
    """The ImageNet-layout folder inside --data (the manifest stays beside it, out of the
    datasets' way)."""
    return os.path.join(args.data, "train")


# ---- one run of one arm (a fresh process: this script with --one ARM) --------------------------


def one_torchvision(args):
    import torch
    from torchvision import datasets, transforms
    tf = transforms.Compose([transforms.RandomResizedCrop(CROP), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    ds = datasets.ImageFolder(image_root(args), transform=tf)
    t1 = time.perf_counter()
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, num_workers=args.workers,
                                         shuffle=True, drop_last=True, persistent_workers=False)
    times, epochs = batches_timed(loader, args.warmup + args.batches)
    check_batch(times["last"], args.batch)
    return dict(first_batch_s=times["first"] - t1, scan_s=t1 - t0, epochs=epochs,
                images_per_s=throughput(times["done"], args))


def batches_timed(loader, count):
    """Iterates `count` batches of `loader` (new epochs as needed); the time each was in hand."""
    done, epochs, last = [], 0, None
    while len(done) < count:
        epochs += 1
        for batch in loader:
            done.append(time.perf_counter())
            last = batch
            if len(done) == count:
                break
    return {"first": done[0], "done": done, "last": last}, epochs


def throughput(done, args):
    # The clock starts when the last warm-up batch is in hand.
    return args.batch * args.batches / (done[-1] - done[args.warmup - 1])


def check_batch(batch, size):
    x, y = batch
    want = (size, 3, CROP, CROP)
    if tuple(x.shape) != want or str(x.dtype) != "torch.float32" or len(y) != size:
        raise RuntimeError(f"batch {tuple(x.shape)} {x.dtype}, not {want} float32")


def dali_import(args):
    """nvidia.dali, from --dali-path appended to sys.path (after the venv's own packages, whose
    numpy and torch win); raises ImportError with the reason."""
    if os.path.isdir(args.dali_path) and args.dali_path not in sys.path:
        sys.path.append(args.dali_path)
    import nvidia.dali as dali
    return dali


def one_dali(args):
    import numpy as np
    import torch
    dali_import(args)
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=args.batch, num_threads=args.workers, device_id=None,
                  seed=args.seed, prefetch_queue_depth=2)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=image_root(args), random_shuffle=True,
                                        name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=CROP, resize_y=CROP, interp_type=types.INTERP_LINEAR,
                           antialias=True)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN],
                                          std=[s * 255 for s in STD],
                                          mirror=fn.random.coin_flip())
        return images, labels

    def batches():
        while True:
            images, labels = p.run()
            yield (torch.from_numpy(np.array(images.as_tensor())),
                   torch.from_numpy(np.array(labels.as_tensor())).view(-1))

    t1 = time.perf_counter()
    p = pipe()
    p.build()
    count = args.warmup + args.batches
    done, last = [], None
    for batch in batches():
        done.append(time.perf_counter())
        last = batch
        if len(done) == count:
            break
    check_batch(last, args.batch)
    return dict(first_batch_s=done[0] - t1, epochs=None, images_per_s=throughput(done, args))


def dali_probe(args):
    """None when DALI imports and runs a CPU-only pipeline here, else the reason it does not."""
    cmd = [args.python, os.path.abspath(__file__), "--one", "dali", "--data", args.data,
           "--dali-path", args.dali_path, "--workers", "1", "--batch", "2", "--batches", "1",
           "--warmup", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    why = next((l for l in reversed(lines) if "Error" in l or "error" in l), lines[-1] if lines
               else f"exit {proc.returncode}")
    if "No module named 'nvidia" in proc.stderr:
        why = (f"nvidia.dali is not importable (not in the venv nor in {args.dali_path}; "
               f"--install-dali puts PyPI's {DALI_WHEEL} there)")
    return why.strip()[:400]


def install_dali(args):
    if os.path.isdir(os.path.join(args.dali_path, "nvidia", "dali")):
        return
    print(f"# pip install --target {args.dali_path} {DALI_WHEEL} (PyPI; ~1 GiB)", file=sys.stderr)
    proc = subprocess.run([args.python, "-m", "pip", "install", "--quiet", "--target",
                           args.dali_path, DALI_WHEEL], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"# pip could not install {DALI_WHEEL}:\n{proc.stderr[-1500:]}", file=sys.stderr)


# ---- Kiln --------------------------------------------------------------------------------------


def kiln_data(args, workers, decode_scale):
    return {"dataset": "image_folder", "root": image_root(args), "batch_size": args.batch,
            "workers": workers, "shuffle": True, "random_resized_crop": CROP,
            "random_flip": True, "mean": MEAN, "std": STD, "decode_scale": decode_scale}


def kiln_probe(args):
    """None when `kiln loader-bench` exists in the build, else why the Kiln arm cannot run."""
    if not os.access(args.kiln, os.X_OK):
        return f"no kiln binary at {args.kiln} (build it, or pass --kiln / --build-dir)"
    # `kiln loader-bench --help` would not do: CLI11 answers the top-level --help before it
    # complains about an unknown word. The subcommands' list in `kiln --help` tells.
    proc = subprocess.run([args.kiln, "--help"], capture_output=True, text=True)
    if not re.search(r"^\s+loader-bench\b", proc.stdout, re.MULTILINE):
        return "kiln loader-bench not available in this build"
    return None


def one_kiln(args, workers, decode_scale, work):
    path = os.path.join(work, "pipeline.toml")
    with open(path, "w") as f:
        # A pipeline names a model even where only its loader runs; mlp is the cheapest.
        f.write(to_toml({"data": kiln_data(args, workers, decode_scale), "model": {"name": "mlp"}}))
    cmd = [args.kiln, "loader-bench", path, "--batches", str(args.batches), "--warmup",
           str(args.warmup)]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    out = json.loads(next(l for l in reversed(proc.stdout.splitlines()) if l.startswith("{")))
    got = (out.get("batches"), out.get("batch_size"), out.get("workers"))
    if got != (args.batches, args.batch, workers):
        raise RuntimeError(f"kiln loader-bench measured (batches, batch_size, workers) = {got}, "
                           f"not {(args.batches, args.batch, workers)}")
    return dict(first_batch_s=out["first_batch_s"], images_per_s=out["images_per_s"],
                epochs=None)


# ---- the bench ---------------------------------------------------------------------------------


def run_python_arm(arm, workers, args):
    cmd = [args.python, os.path.abspath(__file__), "--one", arm, "--data", args.data,
           "--dali-path", args.dali_path, "--workers", str(workers), "--batch", str(args.batch),
           "--batches", str(args.batches), "--warmup", str(args.warmup), "--seed",
           str(args.seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rows(args):
    """The measured rows: (label, runner(workers, work folder))."""
    out = []
    if "torchvision" in args.arms:
        out.append(("torchvision", lambda w, work: run_python_arm("torchvision", w, args)))
    if "dali" in args.arms and args.dali_why is None:
        out.append(("DALI (CPU)", lambda w, work: run_python_arm("dali", w, args)))
    if "kiln" in args.arms and args.kiln_why is None:
        for scale in ("auto", "full"):
            out.append((f"Kiln (decode_scale {scale})",
                        lambda w, work, s=scale: one_kiln(args, w, s, work)))
    return out


def measure(args, tmp):
    arms = rows(args)
    labels = [label for label, _ in arms]
    results = {(label, w): [] for label, _ in arms for w in args.workers}
    for r in range(args.repeats):
        for w in args.workers:
            order = arms if r % 2 == 0 else arms[::-1]
            for label, runner in order:
                work = os.path.join(tmp, f"rep{r}-w{w}-{labels.index(label)}")
                os.makedirs(work)
                time.sleep(args.settle)
                out = runner(w, work)
                if out.get("epochs") not in (None, 1):
                    print(f"# WARNING: {label} workers {w} crossed {out['epochs'] - 1} epoch "
                          f"boundary(ies): raise --images or lower --batches", file=sys.stderr)
                extra = f", folder scan {out['scan_s']:.3f} s" if "scan_s" in out else ""
                print(f"# rep {r + 1}/{args.repeats} workers {w} {label}: "
                      f"{out['images_per_s']:.1f} images/s, first batch "
                      f"{out['first_batch_s']:.3f} s{extra}", file=sys.stderr, flush=True)
                results[(label, w)].append(out)
    return labels, results


def ratios(results, num, den, w):
    a, b = results.get((num, w), []), results.get((den, w), [])
    return [x["images_per_s"] / y["images_per_s"] for x, y in zip(a, b)]


def report(args, manifest, labels, results):
    import torch
    import torchvision
    print(f"\nMachine: {cpu_name()} ({os.cpu_count()} logical CPUs); torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}{args.dali_version}; "
          f"{datetime.date.today().isoformat()}. Load average at start {args.load_start:.2f}, "
          f"at end {os.getloadavg()[0]:.2f}.\n")
    print(f"Data: {manifest['images']} JPEGs in {manifest['classes']} classes "
          f"({', '.join(manifest['photos'])}), quality {manifest['quality']}, mean "
          f"{manifest['mean_bytes'] / 1024:.0f} KiB ({manifest['min_bytes'] / 1024:.0f}–"
          f"{manifest['max_bytes'] / 1024:.0f}), mean resolution "
          f"{manifest['mean_width']:.0f} x {manifest['mean_height']:.0f}; batch {args.batch}, "
          f"{args.batches} measured batches after {args.warmup} warm-up batches, "
          f"{args.repeats} run(s) per arm and workers value.\n")
    print(f"Reproduce: `{args.command}`\n")
    for why, what in ((args.dali_why, "DALI (CPU)"), (args.kiln_why, "Kiln")):
        if why is not None and what.split()[0].lower() in args.arms:
            print(f"{what}: not measured — {why}.\n")
    if labels:
        print("| arm | workers | images/s median (min–max) | first batch s median (min–max) |")
        print("|---|---:|---:|---:|")
        for w in args.workers:
            for label in labels:
                runs = results[(label, w)]
                print(f"| {label} | {w} | {fmt_spread([r['images_per_s'] for r in runs], '.1f')} "
                      f"| {fmt_spread([r['first_batch_s'] for r in runs], '.3f')} |")
    kilns = [l for l in labels if l.startswith("Kiln")]
    refs = [(l, t) for l, t in (("torchvision", 2.0), ("DALI (CPU)", 1.0)) if l in labels]
    if kilns and refs:
        print("\n| workers | Kiln row | " + " | ".join(f"Kiln ÷ {l} (target >= {t:g}x)"
                                                       for l, t in refs) + " |")
        print("|---:|---|" + "---:|" * len(refs))
        for w in args.workers:
            for k in kilns:
                cells = []
                for l, t in refs:
                    rs = ratios(results, k, l, w)
                    ok = "" if not rs else (" ✓" if statistics.median(rs) >= t else " ✗")
                    cells.append(f"**{fmt_spread(rs, '.2f')}**{ok}")
                print(f"| {w} | {k.split('(')[1].rstrip(')')} | " + " | ".join(cells) + " |")
        print("\nRatios: images/s of the two arms in the same repetition and workers value, "
              "median (min–max) over the repetitions; above 1 = Kiln faster.")


# ---- --train ------------------------------------------------------------------------------------


def train_note(args, tmp):
    """A short `kiln run` of resnet-18 on the folder: data_time vs step_time per step."""
    print("\n### kiln run on the folder (--train)\n")
    if not os.access(args.kiln, os.X_OK):
        print(f"Not run: no kiln binary at {args.kiln}.")
        return
    steps = args.train_steps
    data = kiln_data(args, args.train_workers, "auto")
    data["batch_size"] = args.train_batch
    cfg = {
        "run": {"device": "cpu", "seed": 0, "max_steps": steps, "epochs": 1,
                "log_interval": steps, "threads": args.threads, "eval": False,
                "checkpoints": False, "tensorboard": False},
        "data": data,
        "model": {"name": "resnet", "depth": "18"},
        "norm": {"name": "batchnorm"},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4},
        "lr_policy": {"name": "constant", "warmup": "none"},
        "precision": {"name": "fp32"},
    }
    work = os.path.join(tmp, "train")
    os.makedirs(work)
    try:
        records, _ = run_kiln_pipeline(args.kiln, cfg, "", steps, work)
    except RuntimeError as e:
        lines = str(e).splitlines()
        print("Not run: `kiln run` failed (the image_folder dataset is not in this build?):\n")
        print("```\n" + "\n".join(lines if len(lines) <= 7 else lines[:1] + lines[-6:]) + "\n```")
        return
    skip = min(args.train_warmup, steps - 1)
    d = [r["data_time"] for r in records[skip:]]
    s = [r["step_time"] for r in records[skip:]]
    print(f"resnet depth 18, 224 x 224 crops, batch {args.train_batch}, threads {args.threads}, "
          f"data.workers {args.train_workers}, decode_scale auto; steps {skip + 1}–{steps} "
          f"(the first {skip} dropped):\n")
    print("| data_time ms/step median (min–max) | step_time ms/step median (min–max) | "
          "data ÷ (data + step) |")
    print("|---:|---:|---:|")
    print(f"| {fmt_spread([1e3 * x for x in d], '.1f')} "
          f"| {fmt_spread([1e3 * x for x in s], '.1f')} | {sum(d) / (sum(d) + sum(s)):.1%} |")
    print(f"\nimages/s of the training run: {args.train_batch * len(s) / (sum(d) + sum(s)):.1f}; "
          f"the loader's own rate at workers {args.train_workers} is in the table above (a "
          f"step's data_time near 0 = the loader keeps up; the loader's threads compete with "
          f"the step's {args.threads} compute threads for the cores).")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--data", default=os.path.expanduser("~/.cache/kiln/bench-jpeg"),
                    help="folder of the JPEGs (made there once; default ~/.cache/kiln/bench-jpeg)")
    ap.add_argument("--images", type=int, default=4000, help="JPEGs in the folder")
    ap.add_argument("--seed", type=int, default=0, help="seed of the folder and of the loaders")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"comma-separated arms (default {','.join(ARMS)}; none: only --train)")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=50, help="measured batches per run")
    ap.add_argument("--warmup", type=int, default=5,
                    help="batches per run before the clock starts, the first one among them")
    ap.add_argument("--repeats", type=int, default=3, help="runs per arm and workers value")
    ap.add_argument("--train", action="store_true",
                    help="also a short kiln run on the folder: data_time vs step_time")
    ap.add_argument("--train-steps", type=int, default=8)
    ap.add_argument("--train-warmup", type=int, default=2, help="first steps left out")
    ap.add_argument("--train-batch", type=int, default=16)
    ap.add_argument("--train-workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="run.threads of --train")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build", "release"),
                    help="build tree holding bin/kiln")
    ap.add_argument("--kiln", help="the kiln binary (default: BUILD_DIR/bin/kiln)")
    ap.add_argument("--python", default=sys.executable,
                    help="Python with torch and torchvision for the arms (default: this one)")
    ap.add_argument("--dali-path", default=os.path.expanduser("~/.cache/kiln/dali"),
                    help="pip --target folder that holds DALI (default ~/.cache/kiln/dali)")
    ap.add_argument("--install-dali", action="store_true",
                    help=f"pip install {DALI_WHEEL} from PyPI into --dali-path when missing")
    ap.add_argument("--settle", type=float, default=0.5, help="idle seconds before each run")
    ap.add_argument("--max-load", type=float, default=1.0,
                    help="wait until the 1-minute load average is below this (0: do not wait)")
    ap.add_argument("--wait-load", type=int, default=300,
                    help="seconds to wait for the load to drop before measuring anyway")
    ap.add_argument("--one", choices=["torchvision", "dali"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.workers = [int(w) for w in str(args.workers).split(",") if w != ""]
    if args.warmup < 1 or args.batches < 1 or args.batch < 1 or min(args.workers) < 0:
        ap.error("--warmup, --batches and --batch must be >= 1, --workers >= 0")
    if args.one:
        if args.one == "dali" and min(args.workers) < 1:
            ap.error("DALI needs --workers >= 1 (its CPU threads)")
        out = (one_torchvision if args.one == "torchvision" else one_dali)(
            argparse.Namespace(**{**vars(args), "workers": args.workers[0]}))
        print(json.dumps(out))
        return
    args.arms = [a for a in args.arms.split(",") if a and a != "none"]
    for a in args.arms:
        if a not in ARMS:
            ap.error(f"unknown arm '{a}' (known: {', '.join(ARMS)})")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    args.command = shlex.join([args.python,
                               os.path.relpath(os.path.abspath(__file__), REPO)] + sys.argv[1:])
    args.kiln = os.path.abspath(args.kiln or os.path.join(args.build_dir, "bin", "kiln"))
    args.data = os.path.abspath(args.data)
    manifest = make_dataset(args)
    print(f"# data: {args.data}, {manifest['images']} JPEGs, mean "
          f"{manifest['mean_bytes'] / 1024:.0f} KiB, mean {manifest['mean_width']:.0f} x "
          f"{manifest['mean_height']:.0f}", file=sys.stderr)

    args.dali_why, args.dali_version = None, ""
    if "dali" in args.arms:
        if args.install_dali:
            install_dali(args)
        args.dali_why = dali_probe(args)
        if args.dali_why is None:
            if min(args.workers) < 1:
                args.dali_why = "DALI runs with >= 1 CPU threads; --workers has 0"
            dali_version = subprocess.run(
                [args.python, "-c", f"import sys; sys.path.append({args.dali_path!r}); "
                 "import nvidia.dali as d; print(d.__version__)"],
                capture_output=True, text=True).stdout.strip()
            args.dali_version = f", DALI {dali_version} (CPU only, no GPU)"
        else:
            print(f"# DALI arm not run: {args.dali_why}", file=sys.stderr)
    args.kiln_why = kiln_probe(args) if "kiln" in args.arms else None
    if args.kiln_why:
        print(f"# Kiln arm not run: {args.kiln_why}", file=sys.stderr)

    from train_throughput import wait_for_quiet
    if args.arms or args.train:
        wait_for_quiet(args)
    args.load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="kiln-loader-") as tmp:
        labels, results = measure(args, tmp)
        report(args, manifest, labels, results)
        if args.train:
            train_note(args, tmp)


if __name__ == "__main__":
    main()
