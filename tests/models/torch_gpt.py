"""nanoGPT's model.py in PyTorch, the oracle frost.models.gpt is tested against (tests/models/test_gpt.py) and the
opponent of benchmarks/gpt_cpu_step.py: the same parameter names, GPT-2's tanh GELU."""
import torch
import torch.nn as tnn
import torch.nn.functional as TF

from frost.models import GPTConfig


class Conv1D(tnn.Module):
    """Hugging Face GPT-2's linear layer: weight stored (in, out), y = x @ weight + bias."""

    def __init__(self, n_in: int, n_out: int, bias: bool) -> None:
        super().__init__()
        self.weight = tnn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = tnn.Parameter(torch.randn(n_out) * 0.02) if bias else None

    def forward(self, x):
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


class TorchGPT(tnn.Module):
    """nanoGPT's model.py in PyTorch; hf=True uses Conv1D weights and the attn.bias mask buffer, as GPT-2 on the Hub."""

    def __init__(self, c: GPTConfig, hf: bool = False) -> None:
        super().__init__()
        self.c = c
        dense = (lambda i, o, bias: Conv1D(i, o, bias)) if hf else (lambda i, o, bias: tnn.Linear(i, o, bias=bias))
        blocks = []
        for _ in range(c.n_layer):
            block = tnn.Module()
            block.ln_1, block.ln_2 = tnn.LayerNorm(c.n_embd, bias=c.bias), tnn.LayerNorm(c.n_embd, bias=c.bias)
            block.attn, block.mlp = tnn.Module(), tnn.Module()
            block.attn.c_attn = dense(c.n_embd, 3 * c.n_embd, c.bias)
            block.attn.c_proj = dense(c.n_embd, c.n_embd, c.bias)
            if hf:
                block.attn.register_buffer("bias", torch.tril(torch.ones(1, 1, c.block_size, c.block_size)))
            block.mlp.c_fc = dense(c.n_embd, 4 * c.n_embd, c.bias)
            block.mlp.c_proj = dense(4 * c.n_embd, c.n_embd, c.bias)
            blocks.append(block)
        self.transformer = tnn.ModuleDict(dict(
            wte=tnn.Embedding(c.vocab_size, c.n_embd), wpe=tnn.Embedding(c.block_size, c.n_embd),
            h=tnn.ModuleList(blocks), ln_f=tnn.LayerNorm(c.n_embd, bias=c.bias)))
        self.lm_head = tnn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        c, p = self.c, self.c.dropout if self.training else 0.0
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = TF.dropout(self.transformer.wte(idx) + self.transformer.wpe(pos), p, self.training)
        for b in self.transformer.h:
            q, k, v = b.attn.c_attn(b.ln_1(x)).split(c.n_embd, dim=2)
            q, k, v = (t.view(B, T, c.n_head, -1).transpose(1, 2) for t in (q, k, v))
            y = TF.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            x = x + TF.dropout(b.attn.c_proj(y.transpose(1, 2).reshape(B, T, c.n_embd)), p, self.training)
            x = x + TF.dropout(b.mlp.c_proj(TF.gelu(b.mlp.c_fc(b.ln_2(x)), approximate="tanh")), p, self.training)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else TF.cross_entropy(logits.view(-1, c.vocab_size), targets.view(-1),
                                                             ignore_index=-1)
        return logits, loss
