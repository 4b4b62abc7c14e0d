"""Writes a torchvision (or timm) model's state_dict as one safetensors file, the file Kiln's
model.init reads (docs/finetune.md):

    ~/.cache/kiln/venv/bin/python scripts/export_torchvision.py resnet18 resnet18.safetensors
    ~/.cache/kiln/venv/bin/python scripts/export_torchvision.py resnet50 r50.safetensors --random
    ~/.cache/kiln/venv/bin/python scripts/export_torchvision.py timm:vit_small_patch16_224 vit.safetensors

MODEL is a torchvision.models name (resnet18, resnet34, resnet50, resnet101, resnet152 build the
networks Kiln's resnet plugin builds at depth 18 ... 152) or timm:<name> for timm.create_model.
Without --random the pretrained weights are downloaded (torchvision's weights="DEFAULT", timm's
pretrained=True): that needs the internet once, then the files are cached under ~/.cache/torch.
--random writes the model's own random initialisation instead (seeded by --seed), for trying the
flow without a download. --num-classes builds another head (only with --random: pretrained heads
have their own size; Kiln's model.init_skip leaves a new head at Kiln's initialisation).

The tensors are written under their state_dict names, made contiguous, in float32 (or --dtype);
BatchNorm's num_batches_tracked counters stay in (Kiln counts and ignores them).
"""

import argparse

import torch


def build(model, random=False, num_classes=None):
    """The torch.nn.Module `model` names, pretrained unless `random`."""
    kwargs = {} if num_classes is None else {"num_classes": num_classes}
    if model.startswith("timm:"):
        import timm
        return timm.create_model(model[len("timm:"):], pretrained=not random, **kwargs)
    import torchvision
    return torchvision.models.get_model(model, weights=None if random else "DEFAULT", **kwargs)


def state_dict(module, dtype=torch.float32):
    """`module`'s state_dict as safetensors accepts it: detached, contiguous, one storage each,
    floating-point tensors cast to `dtype` (integer counters kept)."""
    out = {}
    for name, t in module.state_dict().items():
        t = t.detach()
        if t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.contiguous().clone()
    return out


def save(module, path, dtype=torch.float32):
    import safetensors.torch
    safetensors.torch.save_file(state_dict(module, dtype), path)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="torchvision.models name, or timm:<name>")
    parser.add_argument("out", help="the safetensors file to write")
    parser.add_argument("--random", action="store_true",
                        help="the model's random initialisation instead of downloaded weights")
    parser.add_argument("--num-classes", type=int, default=None,
                        help="head size (with --random; default: the model's, 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    args = parser.parse_args()
    if args.num_classes is not None and not args.random:
        parser.error("--num-classes needs --random (use model.init_skip for a new head)")
    torch.manual_seed(args.seed)
    module = build(args.model, args.random, args.num_classes)
    save(module, args.out, getattr(torch, args.dtype))
    n = sum(t.numel() for t in module.state_dict().values())
    print(f"{args.out}: {args.model} ({'random' if args.random else 'pretrained'}), "
          f"{len(module.state_dict())} tensors, {n} values")


if __name__ == "__main__":
    main()
