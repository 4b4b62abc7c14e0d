"""torchvision's transforms and timm's mixup/cutmix on the arrays the C++ test wrote.

Reads config.json and image.u8 (H x W x C uint8) from the scratch directory; writes, per case,
what torchvision (v2 and v1 tensor functionals) or timm's formulas give for the same parameters.
timm is not installed here: its Mixup formulas (rand_bbox, correct_lam, mixup_target, _mix_batch
in mode "batch") are written out below, as timm 1.0 has them.
"""
import math

import numpy as np
import torch
import torch.nn.functional as tF
import torchvision.transforms.functional as F1
import torchvision.transforms.v2.functional as F2
from torchvision.transforms import RandomResizedCrop, v2

from common import Scratch

s = Scratch()
cfg = s.config
h, w, c = cfg["height"], cfg["width"], cfg["channels"]
hwc = s.load("image.u8", (h, w, c), np.uint8)
chw = hwc.permute(2, 0, 1).contiguous()
u8 = np.uint8


def save_chw(name, t):
    s.save(name, t.permute(1, 2, 0), u8)  # back to HWC


# resized_crop for given boxes: v2 (native uint8 kernel) and v1 (float, rounded).
for k, (top, left, bh, bw, size) in enumerate(cfg["boxes"]):
    save_chw(f"rrc_v2_{k}.u8", F2.resized_crop(chw, top, left, bh, bw, [size, size], antialias=True))
    save_chw(f"rrc_v1_{k}.u8", F1.resized_crop(chw, top, left, bh, bw, [size, size], antialias=True))

# Resize(shorter side) + CenterCrop, on the image and on its transpose.
for k, (resize, crop, transpose) in enumerate(cfg["eval"]):
    img = chw.transpose(1, 2).contiguous() if transpose else chw
    out = v2.Compose([v2.Resize(resize, antialias=True), v2.CenterCrop(crop)])(img) if resize \
        else v2.CenterCrop(crop)(img)
    save_chw(f"eval_{k}.u8", out)

# Zero padding + RandomCrop at (top, left) of the padded image + flip.
for k, (pad, top, left, flip) in enumerate(cfg["pad_crops"]):
    out = F2.crop(F2.pad(chw, [pad, pad, pad, pad], fill=0), top, left, h, w)
    save_chw(f"padcrop_{k}.u8", F2.horizontal_flip(out) if flip else out)

# ToTensor + Normalize with per-channel values.
norm = F2.normalize(F2.to_dtype(chw, torch.float32, scale=True), cfg["mean"], cfg["std"])
s.save("normalized.f32", norm)

# RandomResizedCrop.get_params statistics with the same ranges.
torch.manual_seed(0)
n = cfg["rrc_draws"]
scale, ratio = cfg["rrc_scale"], cfg["rrc_ratio"]
areas, logr, fallback = [], [], 0
for _ in range(n):
    i, j, bh, bw = RandomResizedCrop.get_params(chw, scale, ratio)
    areas.append(bh * bw / (h * w))
    logr.append(math.log(bw / bh))
areas, logr = np.array(areas), np.array(logr)
s.save("rrc_stats.f64", torch.tensor([areas.mean(), areas.std(), logr.mean(), logr.std()],
                                     dtype=torch.float64), np.float64)
# The fallback (no try fits: area fraction above 1) is deterministic.
fb = RandomResizedCrop.get_params(chw, [1.5, 2.0], ratio)
s.save("rrc_fallback.i64", torch.tensor(fb, dtype=torch.int64), np.int64)
fb_tall = RandomResizedCrop.get_params(chw.transpose(1, 2), [1.5, 2.0], ratio)
s.save("rrc_fallback_tall.i64", torch.tensor(fb_tall, dtype=torch.int64), np.int64)


# timm's formulas (timm/data/mixup.py).
def one_hot(x, num_classes, on_value=1.0, off_value=0.0):
    x = x.long().view(-1, 1)
    return torch.full((x.size()[0], num_classes), off_value, device=x.device).scatter_(1, x, on_value)


def mixup_target(target, num_classes, lam=1.0, smoothing=0.0):
    off_value = smoothing / num_classes
    on_value = 1.0 - smoothing + off_value
    y1 = one_hot(target, num_classes, on_value=on_value, off_value=off_value)
    y2 = one_hot(target.flip(0), num_classes, on_value=on_value, off_value=off_value)
    return y1 * lam + y2 * (1.0 - lam)


def rand_bbox_at(img_shape, lam, cy, cx):  # rand_bbox(margin=0) with its draws given
    ratio = np.sqrt(1 - lam)
    img_h, img_w = img_shape[-2:]
    cut_h, cut_w = int(img_h * ratio), int(img_w * ratio)
    yl = np.clip(cy - cut_h // 2, 0, img_h)
    yh = np.clip(cy + cut_h // 2, 0, img_h)
    xl = np.clip(cx - cut_w // 2, 0, img_w)
    xh = np.clip(cx + cut_w // 2, 0, img_w)
    return yl, yh, xl, xh


mix = cfg["mix"]
n_b, k_cls = mix["batch"], mix["classes"]
x = s.load("mix_x.f32", (n_b, c, h, w))
labels = s.load("mix_labels.i64", (n_b,), np.int64)
# mixup, mode "batch"
lam = mix["lambda"]
xm = x.clone()
x_flipped = xm.flip(0).mul_(1.0 - lam)
xm.mul_(lam).add_(x_flipped)
s.save("mixup_x.f32", xm)
s.save("mixup_t.f32", mixup_target(labels, k_cls, lam, mix["smoothing"]))
# cutmix with correct_lam, at the centre the C++ draw chose
yl, yh, xl, xh = rand_bbox_at(x.shape, mix["cut_lambda"], mix["cy"], mix["cx"])
lam_c = 1.0 - (yh - yl) * (xh - xl) / float(h * w)
xc = x.clone()
xc[:, :, yl:yh, xl:xh] = xc.flip(0)[:, :, yl:yh, xl:xh]
s.save("cutmix_x.f32", xc)
s.save("cutmix_box.f64", torch.tensor([yl, yh, xl, xh, lam_c], dtype=torch.float64), np.float64)
s.save("cutmix_t.f32", mixup_target(labels, k_cls, lam_c, mix["smoothing"]))

# Soft-target cross-entropy: F.cross_entropy with probabilities.
logits = s.load("ce_logits.f32", (n_b, k_cls))
probs = s.load("ce_probs.f32", (n_b, k_cls))
s.save("ce.f64", torch.tensor([tF.cross_entropy(logits.double(), probs.double()).item()],
                              dtype=torch.float64), np.float64)
