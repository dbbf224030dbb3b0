"""Ready-made models: the seed CIFAR ResNet, a GPT-2-style language model, DCGAN's generator and discriminator
(frost.models.dcgan) and a log-mel audio classifier (frost.models.audio)."""
from frost.models.audio import AudioCNN, LogMelSpectrogram
from frost.models import dcgan
from frost.models.gpt import GPT, GPTConfig, KVCache
from frost.models.resnet import BasicBlock, CifarResNet, cifar_resnet

# DCGAN's networks stay under frost.models.dcgan: a frost.models.Generator would read as frost.Generator (random)
__all__ = ["AudioCNN", "BasicBlock", "CifarResNet", "GPT", "GPTConfig", "KVCache", "LogMelSpectrogram", "cifar_resnet",
           "dcgan"]
