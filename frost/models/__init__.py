"""Ready-made models: the seed CIFAR ResNet and a GPT-2-style language model."""
from frost.models.gpt import GPT, GPTConfig, KVCache
from frost.models.resnet import BasicBlock, CifarResNet, cifar_resnet

__all__ = ["BasicBlock", "CifarResNet", "GPT", "GPTConfig", "KVCache", "cifar_resnet"]
