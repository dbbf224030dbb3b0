"""Ready-made models: the seed CIFAR ResNet."""
from frost.models.resnet import BasicBlock, CifarResNet, cifar_resnet

__all__ = ["BasicBlock", "CifarResNet", "cifar_resnet"]
