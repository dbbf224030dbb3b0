"""The seed CIFAR ResNet (ResNet-20 shape: three stages of 16, 32, 64 channels, three basic blocks each)."""
from __future__ import annotations

from frost import nn
from frost.nn import functional as F
from frost.nn import init
from frost.tensor import Tensor


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a shortcut, then ReLU; a 1x1 conv + BN shortcut when the shape changes."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels),
            )
        else:
            self.downsample = None

    def forward(self, x: Tensor) -> Tensor:
        # relu(bn(conv(x))) and relu(bn(conv(out)) + shortcut), each normalization fused with what follows it
        out = self.bn1.forward_fused(self.conv1(x), relu=True)
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.bn2.forward_fused(self.conv2(out), residual=shortcut, relu=True)


class CifarResNet(nn.Module):
    """Stem conv3x3 (3->16) + BN + ReLU, three stages of BasicBlocks, global average pool, Linear (no bias).

    Parameter names (conv1, bn1, layer1.0.conv1, ..., layer2.0.downsample.0, fc) follow torchvision's ResNet.
    The classifier is initialized with xavier_uniform_; convolutions and BN keep their default init.
    """

    def __init__(self, num_classes: int = 10, blocks_per_stage: tuple = (3, 3, 3),
                 widths: tuple = (16, 32, 64)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        in_channels = widths[0]
        for i, (width, blocks) in enumerate(zip(widths, blocks_per_stage)):
            stride = 1 if i == 0 else 2
            layers = []
            for b in range(blocks):
                layers.append(BasicBlock(in_channels, width, stride if b == 0 else 1))
                in_channels = width
            setattr(self, f"layer{i + 1}", nn.Sequential(*layers))
        self.fc = nn.Linear(in_channels, num_classes, bias=False)   # after a global average pool (forward)
        init.xavier_uniform_(self.fc.weight)

    def forward(self, x: Tensor) -> Tensor:
        x = self.bn1.forward_fused(self.conv1(x), relu=True)
        x = self.layer3(self.layer2(self.layer1(x)))
        # avgpool, flatten and fc as one op (F.avg_pool_linear): one kernel each way on the GPU
        return F.avg_pool_linear(x, self.fc.weight, self.fc.bias)


def cifar_resnet(num_classes: int = 10) -> CifarResNet:
    """The seed model: a 20-layer CIFAR ResNet (about 0.27M parameters) for 32x32 RGB images."""
    return CifarResNet(num_classes)
