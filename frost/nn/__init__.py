"""frost.nn: Module and Parameter, the layers, weight initialization (init) and the functional op names."""
from frost.nn.module import IncompatibleKeys, Module, Parameter
from frost.nn.container import ModuleDict, ModuleList, Sequential
from frost.nn.linear import Flatten, Identity, Linear
from frost.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from frost.nn.norm import BatchNorm1d, BatchNorm2d, LayerNorm, RMSNorm
from frost.nn.activation import GELU, LeakyReLU, LogSoftmax, ReLU, SiLU, Sigmoid, Softmax, Softplus, Tanh
from frost.nn.activation import (CELU, ELU, GLU, Hardsigmoid, Hardswish, Hardtanh, LogSigmoid, Mish, PReLU, ReLU6,
                                 SELU, Softsign, Tanhshrink)
from frost.nn.distance import CosineSimilarity, PairwiseDistance
from frost.nn.pool import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from frost.nn.pool import AdaptiveAvgPool1d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, AvgPool1d, MaxPool1d
from frost.nn.resample import (Fold, MaxUnpool1d, MaxUnpool2d, PixelShuffle, PixelUnshuffle, Unfold, Upsample,
                               UpsamplingBilinear2d, UpsamplingNearest2d)
from frost.nn.dropout import Dropout
from frost.nn.sparse import Embedding
from frost.nn.attention import MultiheadAttention
from frost.nn.loss import BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from frost.nn.loss import BCELoss, HuberLoss, KLDivLoss, MarginRankingLoss, SmoothL1Loss
from frost.nn.sync_batch_norm import SyncBatchNorm
from frost.nn import functional, init, parallel, utils

__all__ = [
    "AdaptiveAvgPool2d", "AvgPool2d", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "Conv2d",
    "Conv1d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "GELU", "Identity", "IncompatibleKeys", "L1Loss",
    "LayerNorm", "LeakyReLU", "Linear", "LogSoftmax", "MSELoss", "MaxPool2d", "Module", "ModuleDict",
    "ModuleList", "MultiheadAttention", "NLLLoss", "Parameter", "RMSNorm", "ReLU", "SiLU", "Sequential",
    "Sigmoid", "Softmax", "Softplus", "Tanh", "functional", "init", "utils",
    "CELU", "ELU", "GLU", "Hardsigmoid", "Hardswish", "Hardtanh", "LogSigmoid", "Mish", "PReLU", "ReLU6", "SELU",
    "Softsign", "Tanhshrink", "CosineSimilarity", "PairwiseDistance",
    "BCELoss", "HuberLoss", "KLDivLoss", "MarginRankingLoss", "SmoothL1Loss",
    "Fold", "MaxUnpool1d", "MaxUnpool2d", "PixelShuffle", "PixelUnshuffle", "Unfold", "Upsample",
    "UpsamplingBilinear2d", "UpsamplingNearest2d",
    "AdaptiveAvgPool1d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AvgPool1d", "MaxPool1d",
    "SyncBatchNorm", "parallel",
]
