"""Python twins of Kiln's model plugins, for bench/precision_reference.py.

- ResNet: plugins/model/resnet with depth "small" (CIFAR-style: conv3x3/1 stem, BasicBlocks, the
  first block of stages 2+ strided by 2 with a conv1x1 + norm shortcut, global average pool, fc).
  Convolutions have no bias; inits are torch.nn's defaults, as the plugin's.
- ViT: plugins/model/vit (the same network as tests/oracle/vit.py): conv patch embedding, class
  token, learned position embedding, pre-norm blocks (LayerNorm eps 1e-6, fused-qkv attention
  through scaled_dot_product_attention, GELU MLP), final LayerNorm, linear head; timm's
  trunc_normal_(std=.02) init for linears and embeddings.
- ResNet50: plugins/model/resnet with depth "50" (torchvision's ResNet-50), for
  bench/gpu_throughput.py; see its section at the end.

Parameter names match the plugins' ("conv1.weight", "bn1.bias", "layer2.0.downsample.1.bias",
"blocks.3.attn.qkv.weight", "pos_embed", ...), so Kiln's parameter-group rules (custom_keys,
norm and bias decay) apply to the same tensors here. Norm layers derive from NormLayer so the
precision modes can keep them in float32 the way the host does (host/engine/precision.cpp).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class NormLayer:
    """Marker: a norm layer (kept fp32 under O2 / O3 with keep_norm_fp32, own decay group)."""


class BatchNormAct(nn.BatchNorm2d, NormLayer):
    """BatchNorm2d (momentum 0.1, eps 1e-5) with the optional ReLU the plugin's norm fuses."""

    def __init__(self, channels, relu):
        super().__init__(channels)
        self.relu = relu

    def forward(self, x):
        # Half input with fp32 weights and statistics is what native_batch_norm does for Kiln too.
        y = super().forward(x)
        return F.relu(y) if self.relu else y


class LayerNorm(nn.Module, NormLayer):
    """Normalise in the weights' dtype, return in the input's (the vit plugin's LayerNorm)."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))

    def forward(self, x):
        w = self.weight
        if x.dtype == w.dtype:
            return F.layer_norm(x, w.shape, w, self.bias, self.eps)
        return F.layer_norm(x.to(w.dtype), w.shape, w, self.bias, self.eps).to(x.dtype)


# ---- ResNet (depth "small") ----------------------------------------------------------------------


def conv(cin, cout, kernel, stride):
    return nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False)


class Downsample(nn.Sequential):
    def __init__(self, cin, cout, stride):
        super().__init__(conv(cin, cout, 1, stride), BatchNormAct(cout, relu=False))


class BasicBlock(nn.Module):
    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1 = conv(cin, planes, 3, stride)
        self.bn1 = BatchNormAct(planes, relu=True)
        self.conv2 = conv(planes, planes, 3, 1)
        self.bn2 = BatchNormAct(planes, relu=False)
        self.downsample = Downsample(cin, planes, stride) if stride != 1 or cin != planes else None

    def forward(self, x):
        y = self.bn2(self.conv2(self.bn1(self.conv1(x))))
        return F.relu_(y + (self.downsample(x) if self.downsample is not None else x))


class StagedResNet(nn.Module):
    """The body both ResNet twins share: the stem registered on the model itself (conv1, bn1 as
    torchvision names them; max-pool after it with `maxpool`), stages layer1..layerN of `block`s
    (the first block of every later stage strided 2), global average pooling, fc."""

    maxpool = False

    def add_stages(self, block, channels, planes, blocks, expansion=1):
        for i, (count, width) in enumerate(zip(blocks, planes)):
            stage = nn.Sequential()
            for b in range(count):
                stage.add_module(str(b), block(channels, width, 2 if i > 0 and b == 0 else 1))
                channels = width * expansion
            self.add_module(f"layer{i + 1}", stage)
        self.num_stages = len(blocks)
        return channels

    def forward(self, x):
        x = self.bn1(self.conv1(x))
        if self.maxpool:
            x = F.max_pool2d(x, 3, 2, 1)
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))  # as Kiln's resnet


class ResNetSmall(StagedResNet):
    def __init__(self, in_channels=1, num_classes=10, width=16, blocks=(1, 1, 1)):
        super().__init__()
        self.conv1 = conv(in_channels, width, 3, 1)
        self.bn1 = BatchNormAct(width, relu=True)
        planes = [width * 2**i for i in range(len(blocks))]
        channels = self.add_stages(BasicBlock, width, planes, blocks)
        self.fc = nn.Linear(channels, num_classes)


# ---- ViT -----------------------------------------------------------------------------------------


def vit_linear(fin, fout):
    layer = nn.Linear(fin, fout)
    with torch.no_grad():
        nn.init.trunc_normal_(layer.weight, std=0.02, a=-2.0, b=2.0)
        layer.bias.zero_()
    return layer


class PatchConv(nn.Conv2d):
    def __init__(self, cin, dim, patch):
        super().__init__(cin, dim, patch, stride=patch)  # torch.nn defaults, as the plugin


class PatchEmbed(nn.Module):
    def __init__(self, cin, dim, patch):
        super().__init__()
        self.proj = PatchConv(cin, dim, patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = vit_linear(dim, 3 * dim)
        self.proj = vit_linear(dim, dim)

    def forward(self, x):
        n, t, d = x.shape
        # timm's Attention: unbind, whose backward stacks the three gradients (indexing
        # qkv[0..2] would add three zero-filled full-size tensors instead, a slower twin).
        qkv = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(n, t, d))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = vit_linear(dim, hidden)
        self.fc2 = vit_linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = LayerNorm(dim)
        self.mlp = Mlp(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Vit(nn.Module):
    def __init__(self, in_channels=1, image=28, num_classes=10, patch_size=4, dim=128, depth=6,
                 heads=4, mlp_ratio=2.0, pool="cls"):
        super().__init__()
        self.cls = pool == "cls"
        self.patch_embed = PatchEmbed(in_channels, dim, patch_size)
        tokens = (image // patch_size) ** 2 + (1 if self.cls else 0)
        if self.cls:
            self.cls_token = nn.Parameter(nn.init.trunc_normal_(torch.empty(1, 1, dim), std=0.02,
                                                                a=-2.0, b=2.0))
        self.pos_embed = nn.Parameter(nn.init.trunc_normal_(torch.empty(1, tokens, dim), std=0.02,
                                                            a=-2.0, b=2.0))
        self.blocks = nn.Sequential(*[Block(dim, heads, int(dim * mlp_ratio))
                                      for _ in range(depth)])
        self.norm = LayerNorm(dim)
        self.head = vit_linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        if self.cls:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)
        x = self.norm(self.blocks(x + self.pos_embed))
        return self.head(x[:, 0] if self.cls else x.mean(1))


def build(model_options):
    """The model a Kiln [model] section describes (only the options the bench uses)."""
    o = dict(model_options)
    name = o.pop("name")
    if name == "resnet":
        if o.get("depth", "small") != "small":
            raise ValueError("bench models: only resnet depth 'small' is mirrored")
        return ResNetSmall(width=o.get("width", 16), blocks=tuple(o.get("blocks", (1, 1, 1))))
    if name == "vit":
        if o.get("dropout", 0.0) != 0.0:
            raise ValueError("bench models: vit dropout is not mirrored")
        return Vit(patch_size=o.get("patch_size", 4), dim=o.get("dim", 128),
                   depth=o.get("depth", 6), heads=o.get("heads", 4),
                   mlp_ratio=o.get("mlp_ratio", 2.0), pool=o.get("pool", "cls"))
    raise ValueError(f"bench models: no Python twin for model '{name}'")


# ---- additions for bench/train_throughput.py -----------------------------------------------------
# - MlpClassifier: plugins/model/mlp without norm layers or dropout (flatten, [linear, relu]
#   per hidden layer, linear head); names layers.<i>.linear.{weight,bias}, head.{weight,bias}.
# - ResNet depth "18" on images under 64 pixels: the plugin then keeps the conv3x3/1 stem without
#   max-pool (imagenet_stem needs height >= 64) and builds stages of [2, 2, 2, 2] BasicBlocks of
#   64, 128, 256, 512 channels, strided 1, 2, 2, 2 -- ResNetSmall with width 64, blocks
#   (2, 2, 2, 2), same parameter names.


class MlpHidden(nn.Module):
    def __init__(self, fin, fout):
        super().__init__()
        self.linear = nn.Linear(fin, fout)  # torch.nn's init, as the plugin's Linear

    def forward(self, x):
        return F.relu(self.linear(x))


class MlpClassifier(nn.Module):
    def __init__(self, in_features, num_classes=10, hidden=(256, 128)):
        super().__init__()
        self.layers = nn.Sequential()
        fin = in_features
        for i, width in enumerate(hidden):
            self.layers.add_module(str(i), MlpHidden(fin, width))
            fin = width
        self.head = nn.Linear(fin, num_classes)

    def forward(self, x):
        return self.head(self.layers(x.flatten(1)))


def build_for_input(model_options, channels, height, width, num_classes=10):
    """The model a Kiln [model] section describes for inputs of the given shape (build() assumes
    Fashion-MNIST's 1 x 28 x 28); adds mlp and resnet depth 18 on small images."""
    o = dict(model_options)
    name = o.pop("name")
    o.pop("init", None)
    o.pop("memory_format", None)  # a layout, not a shape: train_reference.py applies it
    if name == "mlp":
        if o.get("dropout", 0.0) != 0.0 or o.get("norm_layers", False):
            raise ValueError("bench models: mlp dropout and norm_layers are not mirrored")
        return MlpClassifier(channels * height * width, num_classes,
                             tuple(o.get("hidden", (256, 128))))
    if name == "resnet":
        if o.get("activation", "relu") != "relu" or o.get("preact", False):
            raise ValueError("bench models: only relu, non-preact resnets are mirrored")
        depth = o.get("depth", "small")
        if depth == "small":
            return ResNetSmall(channels, num_classes, o.get("width", 16),
                               tuple(o.get("blocks", (1, 1, 1))))
        if depth == "18" and height < 64:
            return ResNetSmall(channels, num_classes, 64, (2, 2, 2, 2))
        if depth == "50":
            return ResNet50(channels, num_classes, imagenet_stem=height >= 64)
        raise ValueError(f"bench models: resnet depth '{depth}' at {height} pixels is not mirrored")
    if name == "vit":
        if o.get("dropout", 0.0) != 0.0 or height != width:
            raise ValueError("bench models: vit dropout and non-square images are not mirrored")
        return Vit(channels, height, num_classes, patch_size=o.get("patch_size", 4),
                   dim=o.get("dim", 128), depth=o.get("depth", 6), heads=o.get("heads", 4),
                   mlp_ratio=o.get("mlp_ratio", 2.0), pool=o.get("pool", "cls"))
    raise ValueError(f"bench models: no Python twin for model '{name}'")


# ---- ResNet-50, for bench/gpu_throughput.py ------------------------------------------------------
# plugins/model/resnet with depth "50": torchvision's ResNet-50 (v1.5: the stride on the 3x3 conv
# of the Bottleneck), Bottleneck blocks [3, 4, 6, 3] of 64, 128, 256, 512 planes (x4 out), stages
# strided 1, 2, 2, 2, a conv1x1 + norm shortcut on the first block of every stage; the imagenet
# stem (conv7x7/2, norm + relu, max-pool 3/2/1) for images of 64 pixels and more (the plugin's
# imagenet_stem = height >= 64), else conv3x3/1 without max-pool; global average pool, fc.
# Convolutions have no bias; inits are torch.nn's defaults, as the plugin's. Names are the
# plugin's (torchvision's): conv1.weight, bn1.*, layer3.2.conv2.weight, layer2.0.downsample.{0,1}.*,
# fc.{weight,bias}. The norm layers are nn.BatchNorm2d, so their state_dict also holds
# num_batches_tracked, which Kiln's norm layers do not have (the bench drops it from the init file;
# load_state_dict fills it back in). ReLUs and the residual add run in place, as torchvision's
# (nn.ReLU(inplace=True), out += identity): what a PyTorch user of ResNet-50 runs.


class BatchNormReLU(BatchNormAct):
    """BatchNormAct with its ReLU in place (the norm's output is fresh and saved by no one)."""

    def forward(self, x):
        y = nn.BatchNorm2d.forward(self, x)
        return F.relu_(y) if self.relu else y


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, planes, stride):
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = conv(cin, planes, 1, 1)
        self.bn1 = BatchNormReLU(planes, relu=True)
        self.conv2 = conv(planes, planes, 3, stride)
        self.bn2 = BatchNormReLU(planes, relu=True)
        self.conv3 = conv(planes, cout, 1, 1)
        self.bn3 = BatchNormReLU(cout, relu=False)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(conv(cin, cout, 1, stride),
                                            BatchNormReLU(cout, relu=False))

    def forward(self, x):
        y = self.bn1(self.conv1(x))
        y = self.bn2(self.conv2(y))
        y = self.bn3(self.conv3(y))
        y += self.downsample(x) if self.downsample is not None else x
        return F.relu_(y)


class ResNet50(StagedResNet):
    def __init__(self, in_channels=3, num_classes=1000, imagenet_stem=True,
                 blocks=(3, 4, 6, 3)):
        super().__init__()
        self.maxpool = imagenet_stem
        self.conv1 = conv(in_channels, 64, 7, 2) if imagenet_stem else conv(in_channels, 64, 3, 1)
        self.bn1 = BatchNormReLU(64, relu=True)
        channels = self.add_stages(Bottleneck, 64, (64, 128, 256, 512), blocks,
                                   Bottleneck.expansion)
        self.fc = nn.Linear(channels, num_classes)
