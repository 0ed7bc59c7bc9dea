"""AlexNet for 32x32 CIFAR-10 inputs.

Krizhevsky, Sutskever, Hinton, "ImageNet Classification with Deep Convolutional Neural Networks",
NeurIPS 2012. torchvision's AlexNet starts with an 11x11 stride-4 convolution and three 3x3 stride-2
max-pools, which shrink a 32x32 image to nothing; this variant keeps the five convolutions' widths
(64-192-384-256-256) and the 9216-4096-4096 classifier, with 5x5 / 3x3 stride-1 convolutions and pools
sized so that the feature map is 6x6 as in the original (32 -> 15 -> 7 -> 6). About 57M parameters,
near the ~60M the paper's Table II gives. No one CIFAR-10 AlexNet is standard: a common one
(bearpaw/pytorch-classification, models/cifar/alexnet.py) keeps the 11x11 stride-4 stem, shrinks the map
to 1x1 and drops the 4096-wide classifier (about 2.5M parameters); this one keeps the original's widths,
map and classifier, so that its size and work are the paper's AlexNet's. Larger inputs (data.image_size) are pooled to the same 6x6 map,
as torchvision's AlexNet does. `variant: imagenet` (models/cifar_variants.py) gives torchvision's AlexNet.
"""
from __future__ import annotations

import torch
from torch import nn


class AlexNetCIFAR(nn.Module):
    def __init__(self, num_classes: int = 10, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),  # 32 -> 15
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),  # 15 -> 7
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=1),  # 7 -> 6, the original's 6x6 map
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))  # a no-op at 32x32; larger inputs come down to 6x6
        self.classifier = nn.Sequential(
            nn.Dropout(dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))
