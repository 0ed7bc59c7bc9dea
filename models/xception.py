"""Xception for 32x32 CIFAR-10 inputs.

Chollet, "Xception: Deep Learning with Depthwise Separable Convolutions", CVPR 2017, Figure 5: an entry
flow (two convolutions, then residual blocks of separable convolutions to 128, 256 and 728 channels, each
halving the resolution), a middle flow of 8 residual blocks at 728 channels, and an exit flow
(728 -> 1024 with a stride, then separable convolutions to 1536 and 2048, global average pooling).
It is not in torchvision. For 32x32 inputs, as in the CIFAR reference weiaicunzai/pytorch-cifar100
(models/xception.py), the stem keeps full resolution (stride 1 instead of 2) and the 728-channel entry block
does not downsample, so the entry flow takes 32 to 8, the middle flow runs at 8x8 and the exit flow ends at
4x4. About 20.8M parameters: the paper's ~23M minus the 1000-class head.
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn


class SeparableConv2d(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=False),  # depthwise
            nn.Conv2d(cin, cout, 1, bias=False),  # pointwise
        )


class XceptionBlock(nn.Module):
    """Separable convolutions (ReLU-SepConv-BN) with a residual; strided blocks end in a 3x3 max-pool."""

    def __init__(self, cin: int, channels: List[int], stride: int, relu_first: bool = True) -> None:
        super().__init__()
        layers: List[nn.Module] = []
        prev = cin
        for i, cout in enumerate(channels):
            if i > 0 or relu_first:
                layers.append(nn.ReLU(inplace=False))
            layers += [SeparableConv2d(prev, cout), nn.BatchNorm2d(cout)]
            prev = cout
        if stride > 1:
            layers.append(nn.MaxPool2d(3, stride=stride, padding=1))
        self.body = nn.Sequential(*layers)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, prev, 1, stride=stride, bias=False), nn.BatchNorm2d(prev))
            if stride > 1 or cin != prev
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.skip(x)


class XceptionCIFAR(nn.Module):
    def __init__(self, num_classes: int = 10, middle_blocks: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1, bias=False),  # stride 1 for 32x32 inputs (2 in the paper)
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        )
        self.entry = nn.Sequential(
            XceptionBlock(64, [128, 128], stride=2, relu_first=False),
            XceptionBlock(128, [256, 256], stride=2),
            XceptionBlock(256, [728, 728], stride=1),  # 2 in the paper; 1 for 32x32 inputs (the CIFAR reference)
        )
        self.middle = nn.Sequential(*[XceptionBlock(728, [728, 728, 728], stride=1) for _ in range(middle_blocks)])
        self.exit = nn.Sequential(
            XceptionBlock(728, [728, 1024], stride=2),
            SeparableConv2d(1024, 1536),
            nn.BatchNorm2d(1536),
            nn.ReLU(inplace=True),
            SeparableConv2d(1536, 2048),
            nn.BatchNorm2d(2048),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.exit(self.middle(self.entry(self.stem(x)))))
