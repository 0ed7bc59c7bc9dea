"""torchvision's CNNs in the form people train on 32x32 CIFAR-10 (`variant: cifar`) or as torchvision ships
them for 224x224 ImageNet (`variant: imagenet`).

The ImageNet stems (a 7x7 stride-2 convolution and a max-pool, 4x down before the first block) shrink a
32x32 image to 1x1 before the last blocks: BatchNorm then refuses batch 1 ("Expected more than 1 value
per channel when training"), and the work per image is a fraction of what a CIFAR-10 network does. The
CIFAR forms below change only the stem and the strides, on torchvision's own classes, so that every
block keeps the published widths and depths. Each follows a published CIFAR-10 reference:

- ResNet-50/101/152: 3x3 stride-1 stem, no max-pool; stages at 32, 16, 8, 4 (kuangliu/pytorch-cifar,
  models/resnet.py, whose Bottleneck also strides in its 3x3 convolution, as torchvision's does).
- MobileNetV2: stride-1 stem, the second stage (24 channels) at stride 1; stages down to 4x4
  (kuangliu/pytorch-cifar, models/mobilenetv2.py: "change conv1 stride 2 -> 1", "stride 2 -> 1 for CIFAR10").
- GoogLeNet: a 3x3 stride-1 first convolution and no stem pooling; the inception stages at 32, 16 and 8
  (kuangliu/pytorch-cifar, models/googlenet.py, which runs a3/b3 at 32x32, a4-e4 at 16, a5/b5 at 8).
  torchvision's 1x1 and 3x3 stem convolutions (64 -> 192 channels) stay.
- SqueezeNet 1.0: a 3x3 stride-1 first convolution (96 channels); its three max-pools take 32 to 16, 8
  and 4 (weiaicunzai/pytorch-cifar100, models/squeezenet.py: 3x3 stem, fire modules at 16, 8 and 4).
- VGG16/19: torchvision's convolutions and five max-pools (32 -> 1 at the classifier, as in every CIFAR
  VGG), without the 7x7 adaptive pool that would copy that 1x1 map 49 times into a 25088-wide classifier;
  the classifier is 512-512-10 with dropout (chengyangfu/pytorch-vgg-cifar10, vgg.py; about 15M
  parameters instead of the ImageNet head's 134M).
- AlexNet: models/alexnet.py (torchvision's stride-4 11x11 stem leaves nothing of a 32x32 image).
"""
from __future__ import annotations

from typing import Callable, Dict

from torch import nn

from mtbench.errors import UsageError

VARIANTS = ("cifar", "imagenet")


def _check(variant: str) -> str:
    if variant not in VARIANTS:
        raise UsageError(f"model.workload.net.variant={variant!r} is not known; allowed: {', '.join(VARIANTS)}")
    return variant


def resnet(depth: int = 50, num_classes: int = 10, variant: str = "cifar", width_per_group: int = 64) -> nn.Module:
    """width_per_group: torchvision's bottleneck width knob (64 in the paper; smaller for quick tests)."""
    from torchvision import models

    builders: Dict[int, Callable[..., nn.Module]] = {50: models.resnet50, 101: models.resnet101,
                                                      152: models.resnet152}
    if depth not in builders:
        raise UsageError(f"model.workload.net.depth={depth!r} is not known; allowed: 50, 101, 152")
    net = builders[depth](weights=None, num_classes=num_classes, width_per_group=width_per_group)
    if _check(variant) == "cifar":
        net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision's init
        net.maxpool = nn.Identity()
    return net


# torchvision's MobileNetV2 setting (t: expansion, c: channels, n: blocks, s: first block's stride) with the
# second stage at stride 1, as the CIFAR-10 reference has it
MOBILENETV2_CIFAR_SETTING = [[1, 16, 1, 1], [6, 24, 2, 1], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1],
                             [6, 160, 3, 2], [6, 320, 1, 1]]


def mobilenet_v2(num_classes: int = 10, variant: str = "cifar", width_mult: float = 1.0) -> nn.Module:
    """width_mult: torchvision's channel multiplier (1.0 in the paper)."""
    from torchvision.models import MobileNetV2

    if _check(variant) == "imagenet":
        return MobileNetV2(num_classes=num_classes, width_mult=width_mult)
    net = MobileNetV2(num_classes=num_classes, width_mult=width_mult,
                      inverted_residual_setting=MOBILENETV2_CIFAR_SETTING)
    net.features[0][0].stride = (1, 1)  # the stem convolution: stride 1 for 32x32 inputs
    return net


def googlenet(num_classes: int = 10, variant: str = "cifar") -> nn.Module:
    from torchvision.models import GoogLeNet
    from torchvision.models.googlenet import BasicConv2d

    net = GoogLeNet(num_classes=num_classes, aux_logits=False, init_weights=True)
    if _check(variant) == "cifar":
        conv1 = BasicConv2d(3, 64, kernel_size=3, stride=1, padding=1)
        nn.init.trunc_normal_(conv1.conv.weight, mean=0.0, std=0.01, a=-2, b=2)  # torchvision's init
        net.conv1 = conv1
        net.maxpool1 = nn.Identity()
        net.maxpool2 = nn.Identity()
    return net


def squeezenet(num_classes: int = 10, variant: str = "cifar") -> nn.Module:
    from torchvision.models import squeezenet1_0

    net = squeezenet1_0(weights=None, num_classes=num_classes)
    if _check(variant) == "cifar":
        conv = nn.Conv2d(3, 96, kernel_size=3, stride=1, padding=1)
        nn.init.kaiming_uniform_(conv.weight)  # as torchvision's SqueezeNet init
        nn.init.zeros_(conv.bias)
        net.features[0] = conv
    return net


def vgg(depth: int = 16, num_classes: int = 10, variant: str = "cifar", dropout: float = 0.5) -> nn.Module:
    from torchvision import models

    builders: Dict[int, Callable[..., nn.Module]] = {16: models.vgg16, 19: models.vgg19}
    if depth not in builders:
        raise UsageError(f"model.workload.net.depth={depth!r} is not known; allowed: 16, 19")
    net = builders[depth](weights=None, num_classes=num_classes, dropout=dropout)
    if _check(variant) == "cifar":
        net.avgpool = nn.Identity()  # the five pools leave 512 x 1 x 1: the classifier takes it as it is
        net.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(512, 512), nn.ReLU(True),
            nn.Dropout(dropout), nn.Linear(512, 512), nn.ReLU(True),
            nn.Linear(512, num_classes),
        )
        for m in net.classifier:
            if isinstance(m, nn.Linear):  # torchvision's VGG init
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)
    return net


def alexnet(num_classes: int = 10, variant: str = "cifar") -> nn.Module:
    if _check(variant) == "imagenet":
        from torchvision.models import alexnet as tv_alexnet

        return tv_alexnet(weights=None, num_classes=num_classes)
    from models.alexnet import AlexNetCIFAR

    return AlexNetCIFAR(num_classes=num_classes)
