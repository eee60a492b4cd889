"""CNNs in plain torch (torchvision's architectures, no torchvision): ``resnet18``,
``resnet50``, ``mobilenetv2``, ``densenet121``, ``vgg16``, and a ``unet``.

=============  ==========================================  ==========================  =====================
entry          tiny (image 32, batch 2)                    small                       full (image 224)
=============  ==========================================  ==========================  =====================
resnet18       width 8, blocks (1,1,1,1), 10 classes       width 16, 64px, batch 16    width 64, batch 64
resnet50       width 8, blocks (1,1,1,1), 10 classes       width 16, (3,4,6,3), 64px,  width 64, (3,4,6,3),
                                                           batch 8                     batch 64
mobilenetv2    width x0.25, 1 block per stage              width x0.5, 64px, batch 8   width x1, batch 64
densenet121    growth 8, layers (2,2), 16 stem             growth 16, (3,6,12,8),      growth 32,
                                                           64px, batch 8               (6,12,24,16), batch 64
vgg16          widths /16, classifier 64                   widths /4, 64px, clf 512,   batch 64
                                                           batch 8
unet           base 4, 2 levels, 2 classes, 32px           base 16, 4 levels, 64px,    base 64, 4 levels,
                                                           batch 4                     256px, batch 16
=============  ==========================================  ==========================  =====================

Tiny keeps each architecture's kinds of blocks (both shortcut kinds, dense concatenation
and transitions, inverted residuals with and without skip) with fewer of them, so that a
test compiles it quickly. Full sizes are the real architectures (1000 classes; U-Net: Ronneberger et al.'s 4
levels with BatchNorm, as the common PyTorch implementation). BatchNorm where the real
architectures use it (not in VGG-16). Dropout is 0. Inputs ``(batch, 3, H, W)`` (no grad);
the loss is cross-entropy against fixed random labels (per pixel for the U-Net).

Blocks (full checkpointing): the residual blocks (``layer1.0`` ...), MobileNetV2's
inverted-residual blocks (``features.1`` ...), DenseNet's dense layers
(``features.denseblock1.layers.0`` ...), VGG's five conv groups (``features.0`` ...),
U-Net's levels (``inc``, ``down1`` ... ``up4``; ``up2`` at tiny).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import _to_device_loss, register
from .mlp import cross_entropy


def _conv_bn(cin, cout, k, stride=1, groups=1, act: type[nn.Module] | None = nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


# -- ResNet ------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, planes, stride=1):
        super().__init__()
        cout = planes * 4
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet (v1.5: stride in the 3x3 conv of a bottleneck)."""

    def __init__(self, block, layers, width=64, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = width
        for i, n in enumerate(layers):
            planes = width * 2 ** i
            blocks = []
            for j in range(n):
                blocks.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
                cin = planes * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.num_layers = len(layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_layers):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def block_names(self) -> list[str]:
        return [f"layer{i + 1}.{j}" for i in range(self.num_layers)
                for j in range(len(getattr(self, f"layer{i + 1}")))]


# width, layers, image, batch, classes
_RESNET18 = {"tiny": (8, (1, 1, 1, 1), 32, 2, 10), "small": (16, (2, 2, 2, 2), 64, 16, 100),
             "full": (64, (2, 2, 2, 2), 224, 64, 1000)}
_RESNET50 = {"tiny": (8, (1, 1, 1, 1), 32, 2, 10), "small": (16, (3, 4, 6, 3), 64, 8, 100),
             "full": (64, (3, 4, 6, 3), 224, 64, 1000)}


def _images(image, b, classes, per_pixel=False):
    x = torch.randn(b, 3, image, image)
    y = torch.randint(0, classes, (b, image, image) if per_pixel else (b,))
    return x, y


def _resnet(block, table, size, batch):
    width, layers, image, b, classes = table[size]
    b = batch or b
    model = ResNet(block, layers, width, classes)
    x, y = _images(image, b, classes)
    return dict(model=model, inputs=(x,), loss=_to_device_loss(cross_entropy, y),
                blocks=model.block_names(), batch=b)


@register("resnet18", "model", "ResNet-18 (He et al. 2016), BatchNorm, plain torch")
def _resnet18(size, batch):
    return _resnet(BasicBlock, _RESNET18, size, batch)


@register("resnet50", "model", "ResNet-50 (bottleneck blocks), BatchNorm, plain torch")
def _resnet50(size, batch):
    return _resnet(Bottleneck, _RESNET50, size, batch)


# -- MobileNetV2 -------------------------------------------------------------------------------

def _divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = int(round(cin * expand))
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [_conv_bn(cin, hidden, 1, act=nn.ReLU6)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (Sandler et al. 2018). ``max_repeats`` caps each stage's blocks."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self, width_mult=1.0, classes=1000, max_repeats=None):
        super().__init__()
        cin = _divisible(32 * width_mult)
        last = _divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [_conv_bn(3, cin, 3, 2, act=nn.ReLU6)]
        for t, c, n, s in self.SETTINGS:
            cout = _divisible(c * width_mult)
            for i in range(n if max_repeats is None else min(n, max_repeats)):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(_conv_bn(cin, last, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x):
        x = self.features(x)
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# width_mult, max_repeats, image, batch, classes
_MOBILENET = {"tiny": (0.25, 1, 32, 2, 10), "small": (0.5, None, 64, 8, 100), "full": (1.0, None, 224, 64, 1000)}


@register("mobilenetv2", "model", "MobileNetV2 (inverted residuals, depthwise convs, BatchNorm, ReLU6)")
def _mobilenetv2(size, batch):
    wm, reps, image, b, classes = _MOBILENET[size]
    b = batch or b
    model = MobileNetV2(wm, classes, reps)
    x, y = _images(image, b, classes)
    blocks = [f"features.{i}" for i, m in enumerate(model.features) if isinstance(m, InvertedResidual)]
    return dict(model=model, inputs=(x,), loss=_to_device_loss(cross_entropy, y), blocks=blocks, batch=b)


# -- DenseNet ----------------------------------------------------------------------------------

class DenseLayer(nn.Module):
    """BN-ReLU-conv1x1 (bn_size * growth) - BN-ReLU-conv3x3 (growth) on the concatenated features."""

    def __init__(self, cin, growth, bn_size=4):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

    def forward(self, x):
        x = self.conv1(F.relu(self.norm1(x)))
        return self.conv2(F.relu(self.norm2(x)))


class DenseBlock(nn.Module):
    def __init__(self, n, cin, growth, bn_size=4):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth, bn_size) for i in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = torch.cat([x, layer(x)], 1)
        return x


class DenseNet(nn.Module):
    """torchvision's DenseNet (Huang et al. 2017); DenseNet-121 is growth 32, (6, 12, 24, 16)."""

    def __init__(self, growth=32, block_config=(6, 12, 24, 16), init_features=64, bn_size=4, classes=1000):
        super().__init__()
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, init_features, 7, 2, 3, bias=False))
        self.features.add_module("norm0", nn.BatchNorm2d(init_features))
        self.features.add_module("relu0", nn.ReLU(inplace=True))
        self.features.add_module("pool0", nn.MaxPool2d(3, 2, 1))
        c = init_features
        for i, n in enumerate(block_config):
            self.features.add_module(f"denseblock{i + 1}", DenseBlock(n, c, growth, bn_size))
            c += n * growth
            if i != len(block_config) - 1:
                self.features.add_module(f"transition{i + 1}", nn.Sequential(
                    nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)))
                c //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(c))
        self.classifier = nn.Linear(c, classes)

    def forward(self, x):
        x = F.relu(self.features(x))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def block_names(self) -> list[str]:
        return [f"features.{name}.layers.{j}" for name, m in self.features.named_children()
                if isinstance(m, DenseBlock) for j in range(len(m.layers))]


# growth, block config, stem, image, batch, classes
_DENSENET = {"tiny": (8, (2, 2), 16, 32, 2, 10), "small": (16, (3, 6, 12, 8), 32, 64, 8, 100),
             "full": (32, (6, 12, 24, 16), 64, 224, 64, 1000)}


@register("densenet121", "model", "DenseNet-121 (dense blocks of BN-ReLU-conv layers, transitions)")
def _densenet121(size, batch):
    growth, config, stem, image, b, classes = _DENSENET[size]
    b = batch or b
    model = DenseNet(growth, config, stem, 4, classes)
    x, y = _images(image, b, classes)
    return dict(model=model, inputs=(x,), loss=_to_device_loss(cross_entropy, y), blocks=model.block_names(),
                batch=b)


# -- VGG-16 ------------------------------------------------------------------------------------

class VGG(nn.Module):
    """torchvision's VGG-16 (no BatchNorm): five conv groups, each ending in a max pool, then a
    3-layer classifier. ``pool``: the adaptive average pool's output side (7 in torchvision)."""

    GROUPS = (2, 2, 3, 3, 3)

    def __init__(self, widths=(64, 128, 256, 512, 512), hidden=4096, pool=7, classes=1000):
        super().__init__()
        groups, cin = [], 3
        for n, w in zip(self.GROUPS, widths):
            layers: list[nn.Module] = []
            for _ in range(n):
                layers += [nn.Conv2d(cin, w, 3, padding=1), nn.ReLU(inplace=True)]
                cin = w
            layers.append(nn.MaxPool2d(2, 2))
            groups.append(nn.Sequential(*layers))
        self.features = nn.Sequential(*groups)
        self.pool = pool
        self.classifier = nn.Sequential(
            nn.Linear(cin * pool * pool, hidden), nn.ReLU(inplace=True), nn.Dropout(0.0),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(0.0), nn.Linear(hidden, classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), self.pool)
        return self.classifier(torch.flatten(x, 1))


# widths, hidden, pool, image, batch, classes
_VGG = {"tiny": ((4, 8, 16, 32, 32), 64, 1, 32, 2, 10), "small": ((16, 32, 64, 128, 128), 512, 2, 64, 8, 100),
        "full": ((64, 128, 256, 512, 512), 4096, 7, 224, 64, 1000)}


@register("vgg16", "model", "VGG-16 (13 convs in 5 groups, 3 fully connected layers; no BatchNorm)")
def _vgg16(size, batch):
    widths, hidden, pool, image, b, classes = _VGG[size]
    b = batch or b
    model = VGG(widths, hidden, pool, classes)
    x, y = _images(image, b, classes)
    return dict(model=model, inputs=(x,), loss=_to_device_loss(cross_entropy, y),
                blocks=[f"features.{i}" for i in range(5)], batch=b)


# -- U-Net -------------------------------------------------------------------------------------

class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Down(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.MaxPool2d(2), DoubleConv(cin, cout))


class Up(nn.Module):
    """Transposed-conv upsampling, concatenation with the skip connection, double conv."""

    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], 1))


class UNet(nn.Module):
    """U-Net (Ronneberger et al. 2015) with BatchNorm: ``levels`` down and up levels (4 in the
    paper), ``base`` channels at the top."""

    def __init__(self, base=64, in_channels=3, classes=2, levels=4):
        super().__init__()
        c = [base * 2 ** i for i in range(levels + 1)]
        self.levels = levels
        self.inc = DoubleConv(in_channels, c[0])
        for i in range(levels):
            setattr(self, f"down{i + 1}", Down(c[i], c[i + 1]))
        for i in range(levels):
            setattr(self, f"up{i + 1}", Up(c[levels - i], c[levels - 1 - i]))
        self.outc = nn.Conv2d(c[0], classes, 1)

    def forward(self, x):
        skips = [self.inc(x)]
        for i in range(self.levels):
            skips.append(getattr(self, f"down{i + 1}")(skips[-1]))
        x = skips.pop()
        for i in range(self.levels):
            x = getattr(self, f"up{i + 1}")(x, skips.pop())
        return self.outc(x)

    def block_names(self) -> list[str]:
        return ["inc"] + [f"down{i}" for i in range(1, self.levels + 1)] + [f"up{i}" for i in range(1, self.levels + 1)]


# base, levels, image, batch, classes
_UNET = {"tiny": (4, 2, 32, 2, 2), "small": (16, 4, 64, 4, 2), "full": (64, 4, 256, 16, 2)}


@register("unet", "model", "U-Net (BatchNorm, transposed-conv upsampling), per-pixel loss")
def _unet(size, batch):
    base, levels, image, b, classes = _UNET[size]
    b = batch or b
    model = UNet(base, 3, classes, levels)
    x, y = _images(image, b, classes, per_pixel=True)
    blocks = model.block_names()
    return dict(model=model, inputs=(x,), loss=_to_device_loss(cross_entropy, y), blocks=blocks, batch=b)


class ConvBN(nn.Module):
    """A small CNN with BatchNorm, ReLU, pooling and a residual connection."""

    def __init__(self, channels=8, classes=10, dropout=0.0, blocks=1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                          nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels))
            for _ in range(blocks))
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = torch.relu(x + block(x))
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(self.drop(x))


class PooledConvBN(nn.Module):
    """A VGG-style CNN with BatchNorm: for each width a 3x3 convolution, BatchNorm, ReLU and a
    2x2 max pool, then a linear classifier on the flattened features of a ``side`` x ``side``
    image. On more than one CPU thread inductor hands each max pool's backward to ATen's
    scatter (``benchmarks/user_trial.py --model vgg``)."""

    def __init__(self, widths=(16, 32, 64, 64), classes=10, side=32):
        super().__init__()
        layers, cin = [], 3
        for w in widths:
            layers += [_conv_bn(cin, w, 3, act=nn.ReLU), nn.MaxPool2d(2)]
            cin, side = w, side // 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin * side * side, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))
