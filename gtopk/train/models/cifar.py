"""CIFAR-10 networks of the paper: VGG-16 (CIFAR variant) and ResNet-20 (option-A shortcuts).

AlexNet and ResNet-50 come from torchvision (``torchvision.models.alexnet`` /
``resnet50`` with ``weights=None``); see ``conf/model/``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

VGG16_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG16(nn.Module):
    """13 conv3x3 (with bias) + BatchNorm + ReLU, 5 max-pools, one Linear(512, classes).
    14,728,266 parameters for 10 classes and 3 input channels (``in_channels``: 1 for grey
    data, 1,152 fewer). Inputs of 32 x 32 pixels (the five pools leave 1 x 1)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = in_channels
        for v in VGG16_LAYERS:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c_in, int(v), 3, padding=1), nn.BatchNorm2d(int(v)), nn.ReLU(inplace=True)]
                c_in = int(v)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(1))


class _BasicBlock(nn.Module):
    """Two conv3x3 + BN; option-A shortcut: stride-2 subsampling and zero-padded channels."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.pad = c_out - c_in
        self.stride = stride

    def shortcut(self, x: Tensor) -> Tensor:
        if self.stride == 1 and self.pad == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """He et al.'s CIFAR ResNet with n = 3 blocks per stage (16/32/64 channels).
    269,722 parameters for 10 classes and 3 input channels (``in_channels``: 1 for grey
    data, 288 fewer). Any input size (global average pooling)."""

    def __init__(self, num_classes: int = 10, blocks_per_stage: int = 3, in_channels: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        stages, c_in = [], 16
        for c_out, stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(blocks_per_stage):
                stages.append(_BasicBlock(c_in, c_out, stride if b == 0 else 1))
                c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(64, num_classes)
        for mod in self.modules():
            if isinstance(mod, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(mod.weight)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn(self.conv(x)))
        out = self.stages(out)
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))
