"""An activation in the matrix product's epilogue, without a graph compiler: GELU after a linear layer (GPT-2's MLP),
computed by cuDNN in the same graph as the product and its bias while a step is captured.

The linear layer does not know that GELU comes next, so the step teaches it: while a jitted step warms up, the
products that GELU reads are remembered by their signature (shapes, strides, dtype); at the next warm-up call and in
the capture, matmul_bias_cuda (frost/accel/matmul.py) asks cuDNN for the product and its GELU in one graph and keeps
the GELU beside the product, where gelu_kernels (frost/accel/gelu.py) takes it instead of launching its kernel. A
kept GELU is taken only for the same memory, unchanged since (version 0), in the same form; the product it belongs
to stays referenced until then, so that no other array can reuse its address. GPT-2 124M on an H100: 35.29 ->
34.72 ms/step (benchmarks/results/gpt2_124m_bf16_jit_gelu_epilogue_40steps_h100_033a41b.json). On by default
since 36e0953: at b38b235 its jitted test and the GPT jit-replay-equals-eager test passed with it on (H100), and
GPT-2 124M ran 35.30 -> 34.74 ms/step in one call
(benchmarks/results/gpt2_124m_bf16_jit_epilogue_xent_ab_h100_b38b235.json); FROST_CUDNN_MATMUL_GELU=0 switches it
off."""
from __future__ import annotations

import os
from collections import OrderedDict

from frost.jit import warming_up
from frost.layout import data_ptr

FUSED_GELU = os.environ.get("FROST_CUDNN_MATMUL_GELU", "1") == "1"
_REMEMBERED = 4  # products a warm-up remembers at once (a step reads each soon after making it)
_followed_by: dict = {}      # product signature -> the GELU form ("gelu" / "gelu_tanh") that read such products
_fused_in_warm_up: set = set()   # signatures whose fused graph a warm-up built (a capture may then use it)
_recent: OrderedDict = OrderedDict()   # address -> (signature, product): the last products made in a warm-up
_kept: OrderedDict = OrderedDict()     # address -> (product, form, activation)


def _address(array) -> tuple:
    return (data_ptr(array), array.size, str(array.dtype))


def _bounded_put(table: OrderedDict, key, value) -> None:
    table[key] = value
    while len(table) > _REMEMBERED:
        table.popitem(last=False)


def activation_after(signature: tuple, capturing: bool) -> str | None:
    """The activation to compute in the epilogue of a product of this signature: the one GELU form that read such
    products in a warm-up; in a capture only where a warm-up has built that fused graph already."""
    if not FUSED_GELU:
        return None
    form = _followed_by.get(signature)
    if form is not None and capturing and signature not in _fused_in_warm_up:
        return None
    return form


def made(signature: tuple, product) -> None:
    """A product made without an activation: remembered while warming up, for gelu_kernels to report."""
    if warming_up():
        _bounded_put(_recent, _address(product), (signature, product))


def keep(signature: tuple, product, form: str, activation) -> None:
    """`activation` (form) of `product`, computed in its epilogue, for take() to hand to the activation's op."""
    if warming_up():
        _fused_in_warm_up.add(signature)
    _bounded_put(_kept, _address(product), (product, form, activation))


def take(x, form: str):
    """x's activation `form` (an array of x's shape) when the epilogue of the product x is computed it, x being
    unchanged since; else None (and, while warming up, learn that x's kind of product is followed by `form`)."""
    if not _kept and not _recent:   # nothing kept or remembered (the fusion off, eager steps): no address to take
        return None
    address = _address(x.data)
    kept = _kept.pop(address, None)
    if kept is not None and kept[1] == form and x._version == 0 and x.data.flags.c_contiguous:
        return kept[2].reshape(x.shape)
    recent = _recent.pop(address, None)
    if recent is not None and warming_up():
        _followed_by[recent[0]] = form
    return None
