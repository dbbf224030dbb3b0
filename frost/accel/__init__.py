"""The acceleration layer: fast paths that make particular ops fast on a particular device, beside the core.

Each module here imports the core and registers its implementations with frost.dispatch (op, device, dtypes,
memory layouts, a predicate on the call); the core's ops ask the table and otherwise run their reference code. The
core never imports this package: frost/__init__.py imports it once, so that the registrations happen. Without it
Frost stays correct, only slower, except that random draws on a GPU need its generator (philox.py). How to add one:
docs/gpu.md, "How a fast path registers".
"""
from frost.accel import (add, augment, batch_norm, bias, cast, conv, cross_entropy, cudnn_attention, dropout,
                         flash_attention, gelu, grad_norm, head, jpeg_decode, layer_norm, matmul, philox, png_inflate,
                         resized_crop)

__all__ = ["add", "augment", "batch_norm", "bias", "cast", "conv", "cross_entropy", "cudnn_attention", "dropout",
           "flash_attention", "gelu", "grad_norm", "head", "jpeg_decode", "layer_norm", "matmul", "philox",
           "png_inflate", "resized_crop"]
