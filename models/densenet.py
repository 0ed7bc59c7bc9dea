"""DenseNet for CIFAR (DenseNet-40 and DenseNet-100, growth rate 12).

Huang, Liu, van der Maaten, Weinberger, "Densely Connected Convolutional Networks", CVPR 2017, section 3
and Table 2. Three dense blocks of (depth - 4) / 3 layers (/ 6 with bottlenecks), 16 initial channels
(2 x growth with bottlenecks), transitions of BN-ReLU-1x1 conv-2x2 average pool, then global average
pooling. torchvision only has the ImageNet DenseNets (121+), whose 4 blocks and 7x7 stem do not fit
32x32 inputs. Plain DenseNet-40 (k=12) has ~1.0M parameters and DenseNet-100 (k=12) ~7.0M, as in the
paper's Table 2; `bottleneck=true, compression=0.5` gives the DenseNet-BC variants.
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn


class _DenseLayer(nn.Module):
    def __init__(self, in_channels: int, growth: int, bottleneck: bool, dropout: float) -> None:
        super().__init__()
        layers: List[nn.Module] = []
        channels = in_channels
        if bottleneck:
            layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.Conv2d(channels, 4 * growth, 1, bias=False)]
            channels = 4 * growth
        layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.Conv2d(channels, growth, 3, padding=1, bias=False)]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], dim=1)


class DenseNetCIFAR(nn.Module):
    def __init__(
        self,
        depth: int = 40,
        growth: int = 12,
        bottleneck: bool = False,
        compression: float = 1.0,
        dropout: float = 0.0,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        per_block = (depth - 4) // (6 if bottleneck else 3)
        if per_block < 1 or (depth - 4) % (6 if bottleneck else 3):
            raise ValueError(f"depth={depth} does not make 3 equal dense blocks (DenseNet needs depth = 3n + 4)")
        channels = 2 * growth if bottleneck else 16
        layers: List[nn.Module] = [nn.Conv2d(3, channels, 3, padding=1, bias=False)]
        for block in range(3):
            for _ in range(per_block):
                layers.append(_DenseLayer(channels, growth, bottleneck, dropout))
                channels += growth
            if block < 2:
                out = int(channels * compression)
                layers += [
                    nn.BatchNorm2d(channels),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(channels, out, 1, bias=False),
                    nn.AvgPool2d(2),
                ]
                channels = out
        layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
