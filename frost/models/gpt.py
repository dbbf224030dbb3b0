"""GPT-2 in one readable file, after Andrej Karpathy's nanoGPT (model.py), written against Frost's API.

A GPT is token + position embeddings, `n_layer` pre-LayerNorm blocks (causal self-attention, then a GELU MLP,
each added to the residual stream), a final LayerNorm and a linear head that shares its weight with the token
embedding. Parameter names are nanoGPT's (`transformer.h.0.attn.c_attn.weight`, ...), so state dicts move
across by name; `GPT.from_pretrained_safetensors` reads the Hugging Face GPT-2 layout (`model.safetensors`).

The MLP uses GPT-2's own GELU, the tanh approximation (Hugging Face's "gelu_new"), so that released GPT-2
weights give GPT-2's outputs. Attention goes through `F.scaled_dot_product_attention`, where a fused
attention kernel can plug in without touching this file.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from frost import nn
from frost.autograd import is_grad_enabled, no_grad
from frost.io import expand_path, read_safetensors
from frost.nn import functional as F
from frost.nn import init
from frost.ops.elementwise import where
from frost.ops.random import sample_categorical
from frost.ops.reduce import argmax, topk
from frost.ops.shape import cat
from frost.optim import AdamW
from frost.tensor import Tensor, arange


@dataclass
class GPTConfig:
    """The sizes of a GPT. bias=False drops the biases of every Linear and LayerNorm (nanoGPT's option)."""

    block_size: int = 1024   # the longest context, in tokens (the position table's length)
    vocab_size: int = 50304  # GPT-2's 50,257 tokens padded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig: {name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout}")

    @classmethod
    def shakespeare_char(cls, vocab_size: int = 65) -> "GPTConfig":
        """nanoGPT's character-level tinyshakespeare model (config/train_shakespeare_char.py): 10.7M parameters."""
        return cls(block_size=256, vocab_size=vocab_size, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False)

    @classmethod
    def gpt2_124m(cls) -> "GPTConfig":
        """GPT-2 small (124M parameters) with its vocabulary padded to 50,304."""
        return cls(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=True)


class KVCache:
    """Every layer's keys and values of the positions seen so far, for generation.

    Decoding one more token then runs the model on that token alone: its query attends to the cached keys.
    Arrays are allocated once for block_size positions. It holds no autograd graph, so it refuses to run while
    gradients are enabled (use it under frost.no_grad(), as generate() does).
    """

    def __init__(self, n_layer: int, block_size: int) -> None:
        self.block_size = block_size
        self.length = 0  # positions stored; every layer holds the same number once a forward has finished
        self._keys: list = [None] * n_layer
        self._values: list = [None] * n_layer

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new positions' keys and values (B, H, T, D) after the cached ones; return all of them."""
        if is_grad_enabled():
            raise RuntimeError("KVCache.update: the cache keeps no autograd graph; run it under frost.no_grad()")
        batch, heads, new, head_dim = k.shape
        end = self.length + new
        if end > self.block_size:
            raise RuntimeError(f"KVCache.update: {self.length} cached + {new} new positions exceed block_size="
                               f"{self.block_size}")
        if self._keys[layer] is None or self._keys[layer].shape[:2] != (batch, heads):
            shape = (batch, heads, self.block_size, head_dim)
            self._keys[layer] = k.xp.empty(shape, dtype=k.data.dtype)
            self._values[layer] = v.xp.empty(shape, dtype=v.data.dtype)
        self._keys[layer][:, :, self.length:end] = k.data
        self._values[layer][:, :, self.length:end] = v.data
        return Tensor(self._keys[layer][:, :, :end]), Tensor(self._values[layer][:, :, :end])

    def clear(self) -> None:
        self.length = 0


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k and v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = self._attend(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        p = self.dropout if self.training else 0.0
        T, S = q.shape[-2], k.shape[-2]
        if T == S:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        # with a cache the T new queries are the last T of the S positions: the causal mask is aligned
        # bottom-right (is_causal aligns it top-left); one new query may see every key
        mask = None if T == 1 else Tensor(q.xp.tril(q.xp.ones((T, S), dtype=bool), k=S - T))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


class MLP(nn.Module):
    """Linear to 4x the width, GPT-2's GELU (tanh form), linear back."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """x + attn(ln_1(x)), then + mlp(ln_2(x)): pre-LayerNorm, so the residual stream itself is never normalized."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A GPT-2-style language model: forward(idx, targets) gives logits (B, T, vocab_size) and the loss."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: one matrix embeds tokens and scores them (the same Parameter, so one gradient sum)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2 scales the layers that write into the residual stream by 1/sqrt(2 n_layer) (two per block),
        # so that the stream's variance does not grow with depth
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position table (the token table counts: it is the head too)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    # ------------------------------------------------------------ forward

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, vocab_size) for token ids idx (B, T); with targets (B, T) also the mean cross-entropy
        over the positions whose target is not -1."""
        self._check_tokens("idx", idx)
        if targets is not None:
            self._check_tokens("targets", targets)
            if targets.shape != idx.shape:
                raise ValueError(f"GPT.forward: targets of shape {targets.shape} must have idx's shape {idx.shape}")
        logits = self.lm_head(self.hidden_states(idx))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def hidden_states(self, idx: Tensor, cache: KVCache | None = None) -> Tensor:
        """The final LayerNorm's output (B, T, n_embd); with a cache, idx continues the cached positions."""
        B, T = idx.shape
        past = cache.length if cache is not None else 0
        if past + T > self.config.block_size:
            raise ValueError(f"GPT: cannot run {past + T} positions ({past} cached + {T} new), the block_size is "
                             f"only {self.config.block_size}")
        pos = arange(past, past + T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for layer, block in enumerate(self.transformer.h):
            x = block(x, cache, layer)
        if cache is not None:
            cache.length += T
        return self.transformer.ln_f(x)

    def _check_tokens(self, name: str, t: Tensor) -> None:
        if not isinstance(t, Tensor) or t.ndim != 2 or t.dtype.is_floating_point or t.dtype.name == "bool":
            what = f"{t.dtype} tensor of shape {t.shape}" if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"GPT.forward: {name} must be a 2-D (batch, time) integer tensor, got a {what}")
        if t.shape[1] > self.config.block_size:
            raise ValueError(f"GPT.forward: {name} has {t.shape[1]} positions, more than block_size="
                             f"{self.config.block_size}")

    # ------------------------------------------------------------ training helpers

    def configure_optimizers(self, weight_decay: float, lr: float, betas: tuple[float, float]) -> AdamW:
        """AdamW that decays the matrices (matmul weights, embeddings) but not biases and LayerNorm gains."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        return AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)

    def estimate_mfu(self, fwdbwd_per_iter: int, dt: float, peak_flops: float = 989e12) -> float:
        """Model FLOPs utilization of one iteration of `fwdbwd_per_iter` sequences taking `dt` seconds.

        FLOPs per token are 6N (matmuls, forward and backward) + 12 L H Q T (attention), as in the PaLM paper's
        appendix B and nanoGPT; peak_flops defaults to an H100/H200's dense bf16 tensor-core peak.
        """
        c = self.config
        flops_per_token = 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size
        return flops_per_token * c.block_size * fwdbwd_per_iter / dt / peak_flops

    # ------------------------------------------------------------ generation

    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 use_cache: bool = True) -> Tensor:
        """idx (B, T) followed by max_new_tokens sampled tokens, each from the model's next-token distribution.

        temperature divides the logits (0 picks the most likely token); top_k keeps the k most likely tokens.
        Runs in eval mode (no dropout) and restores the module's mode. With use_cache the keys and values
        of earlier positions are kept (KVCache) and each step runs on one token; the tokens are the same as
        without it. Past block_size tokens the context is the last block_size tokens, as nanoGPT, and the
        cache is rebuilt each step (positions shift), so long generations gain nothing from it there.
        """
        self._check_generate_args(idx, max_new_tokens, temperature, top_k)
        was_training = self.training
        self.eval()
        cache = KVCache(self.config.n_layer, self.config.block_size) if use_cache else None
        try:
            with no_grad():
                for _ in range(max_new_tokens):
                    logits = self.lm_head(self._next_hidden(idx, cache))
                    idx = cat([idx, self._sample(logits[:, -1, :], temperature, top_k)], dim=1)
        finally:
            self.train(was_training)
        return idx

    def _next_hidden(self, idx: Tensor, cache: KVCache | None) -> Tensor:
        """The hidden state of idx's last position (B, 1, n_embd), from the cache when it holds the rest."""
        block = self.config.block_size
        if cache is not None and 0 < cache.length == idx.shape[1] - 1 < block:
            return self.hidden_states(idx[:, -1:], cache)
        if cache is not None:
            cache.clear()
        return self.hidden_states(idx[:, -block:], cache)[:, -1:]

    @staticmethod
    def _sample(logits: Tensor, temperature: float, top_k: int | None) -> Tensor:
        """One token id per row of logits (B, vocab), shape (B, 1)."""
        if temperature == 0:
            return argmax(logits, dim=-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            kth_largest = topk(logits, min(top_k, logits.shape[-1]), dim=-1)[0][:, -1:]
            logits = where(logits < kth_largest, float("-inf"), logits)
        return sample_categorical(logits).reshape(-1, 1)

    def _check_generate_args(self, idx: Tensor, max_new_tokens: int, temperature: float,
                                   top_k: int | None) -> None:
        if not isinstance(idx, Tensor) or idx.ndim != 2 or idx.shape[1] == 0 or idx.dtype.is_floating_point:
            raise TypeError(f"GPT.generate: idx must be a (batch, time) integer tensor with at least one token, "
                            f"got {idx.shape if isinstance(idx, Tensor) else type(idx).__name__}")
        if max_new_tokens < 0:
            raise ValueError(f"GPT.generate: max_new_tokens must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"GPT.generate: temperature must be >= 0 (0 = greedy), got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"GPT.generate: top_k must be None or >= 1, got {top_k}")

    # ------------------------------------------------------------ Hugging Face GPT-2 checkpoints

    @classmethod
    def from_pretrained_safetensors(cls, path: str | os.PathLike, config: GPTConfig | None = None) -> "GPT":
        """A GPT holding the weights of a Hugging Face GPT-2 `model.safetensors` (GPT2Model or GPT2LMHeadModel).

        Keys may carry the `transformer.` prefix; the causal-mask buffers (`attn.bias`, `attn.masked_bias`) are
        skipped; Conv1D weights, stored (in, out), are transposed to Linear's (out, in). Without `config` the
        sizes come from the tensors' shapes, and n_head from a config.json beside the file (else 64-wide heads,
        as every GPT-2 size). The model is float32 on the CPU (move it with .to()).
        """
        path = expand_path(path)
        tensors = read_safetensors(path)
        if config is None:
            config = _config_from_tensors(tensors, path)
        model = cls(config)
        model.load_state_dict(_hf_to_frost_state(tensors, path))
        return model


# ---------------------------------------------------------------- the Hugging Face layout

_CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")  # the dot: "c_attn.bias" is a weight
_LAYER_KEY = re.compile(r"h\.(\d+)\.")


def _hf_to_frost_state(tensors: dict[str, np.ndarray], path: str) -> dict[str, np.ndarray]:
    """Hugging Face GPT-2 names and layouts -> this module's state dict (lm_head.weight is wte's)."""
    state: dict[str, np.ndarray] = {}
    head = None
    for key, array in tensors.items():
        name = key.removeprefix("transformer.")
        if name.endswith(_MASK_BUFFERS):
            continue
        if name == "lm_head.weight":
            head = array
            continue
        state["transformer." + name] = array.T if name.endswith(_CONV1D_WEIGHTS) else array
    wte = state.get("transformer.wte.weight")
    if wte is None:
        raise ValueError(f"GPT.from_pretrained_safetensors: {path} has no token embedding (wte.weight)")
    if head is not None and not np.array_equal(head, wte):
        raise ValueError(f"GPT.from_pretrained_safetensors: {path} has an lm_head.weight different from wte.weight; "
                         f"this GPT ties them and cannot hold an untied head")
    state["lm_head.weight"] = wte
    return state


def _config_from_tensors(tensors: dict[str, np.ndarray], path: str) -> GPTConfig:
    names = {key.removeprefix("transformer.") for key in tensors}
    layers = {int(m.group(1)) for m in map(_LAYER_KEY.match, names) if m}
    if "wte.weight" not in names or "wpe.weight" not in names or not layers:
        raise ValueError(f"GPT.from_pretrained_safetensors: {path} is not a GPT-2 checkpoint (no wte.weight, "
                         f"wpe.weight or h.<i>.* tensors)")
    prefix = "transformer." if "transformer.wte.weight" in tensors else ""
    vocab_size, n_embd = tensors[prefix + "wte.weight"].shape
    block_size = tensors[prefix + "wpe.weight"].shape[0]
    return GPTConfig(block_size=int(block_size), vocab_size=int(vocab_size), n_layer=max(layers) + 1,
                     n_head=_n_head_beside(path, int(n_embd)), n_embd=int(n_embd), dropout=0.0,
                     bias="h.0.attn.c_attn.bias" in names)


def _n_head_beside(path: str, n_embd: int) -> int:
    """n_head from the Hugging Face config.json next to the weights, or n_embd / 64 (GPT-2's head width)."""
    config_path = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if os.path.isfile(config_path):
        with open(config_path) as f:
            try:
                n_head = json.load(f).get("n_head")
            except (ValueError, AttributeError) as e:  # bad JSON, or JSON that is not an object
                raise ValueError(f"GPT.from_pretrained_safetensors: {config_path} is not a valid config.json "
                                 f"({e})") from None
        if isinstance(n_head, int) and n_head > 0:
            return n_head
    return max(1, n_embd // 64)
