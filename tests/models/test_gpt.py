"""frost.models.gpt against a nanoGPT-style PyTorch twin (float64): logits, loss, every gradient, an AdamW step,
generation with and without the KV cache, sampling, the Hugging Face GPT-2 loader, and a short training run."""
import json
import math

import numpy as np
import pytest
import torch

import frost
from frost.models import GPT, GPTConfig, KVCache
from frost.io import read_safetensors

from .torch_gpt import TorchGPT
from .twins import assert_same_parameter_grads, with_weights_of

TINY = GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)


# ---------------------------------------------------------------- the PyTorch twin (tests/models/torch_gpt.py)


def twin_of(model: GPT, dtype=torch.float64) -> TorchGPT:
    twin = with_weights_of(model, TorchGPT(model.config))
    return twin if dtype == torch.float64 else twin.to(dtype)


def tokens(shape, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=shape)


def tiny_model(config: GPTConfig = TINY, seed: int = 0) -> GPT:
    frost.manual_seed(seed)
    return GPT(config).double()


# ---------------------------------------------------------------- forward and backward parity


@pytest.mark.parametrize("bias", [True, False])
def test_logits_loss_and_every_gradient_match_the_torch_twin(bias):
    config = GPTConfig(**{**TINY.__dict__, "bias": bias})
    model = tiny_model(config)
    twin = twin_of(model)
    idx, targets = tokens((3, 12), 37, 1), tokens((3, 12), 37, 2)
    targets[0, :4] = -1  # ignored positions, as nanoGPT's ignore_index=-1
    logits, loss = model(frost.tensor(idx), frost.tensor(targets))
    t_logits, t_loss = twin(torch.from_numpy(idx), torch.from_numpy(targets))
    np.testing.assert_allclose(logits.detach().numpy(), t_logits.detach().numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-12)
    loss.backward()
    t_loss.backward()
    assert_same_parameter_grads(model, twin, rtol=1e-10, atol=1e-14)


def test_forward_without_targets_gives_logits_only_and_checks_its_input():
    model = tiny_model()
    logits, loss = model(frost.tensor(tokens((2, 5), 37, 0)))
    assert logits.shape == (2, 5, 37) and loss is None
    with pytest.raises(ValueError, match="block_size"):
        model(frost.tensor(tokens((1, 17), 37, 0)))
    with pytest.raises(TypeError, match="integer"):
        model(frost.randn(2, 5))
    with pytest.raises(ValueError, match="targets"):
        model(frost.tensor(tokens((2, 5), 37, 0)), frost.tensor(tokens((2, 4), 37, 0)))


def test_config_presets_and_validation():
    char = GPTConfig.shakespeare_char()
    assert (char.n_layer, char.n_head, char.n_embd, char.block_size, char.dropout) == (6, 6, 384, 256, 0.2)
    small = GPTConfig.gpt2_124m()
    assert (small.n_layer, small.n_head, small.n_embd, small.block_size, small.vocab_size) == (12, 12, 768, 1024, 50304)
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.0)


def test_parameter_count_is_nanogpts():
    frost.manual_seed(0)
    model = GPT(GPTConfig.shakespeare_char())
    C, L, V = 384, 6, 65
    per_block = 12 * C * C + 2 * C  # attention 4 C^2, MLP 8 C^2, two LayerNorm gains (no biases)
    assert model.num_params() == L * per_block + V * C + C  # + ln_f; nanoGPT prints "10.65M"
    assert model.num_params(non_embedding=False) == model.num_params() + 256 * C


def test_head_shares_the_token_embedding_weight():
    model = tiny_model()
    assert model.lm_head.weight is model.transformer.wte.weight
    names = [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    model.lm_head.weight.data[3] = 7.0
    assert (model.transformer.wte.weight.detach().numpy()[3] == 7.0).all()


def test_gpt2_initialization():
    frost.manual_seed(0)
    config = GPTConfig(block_size=32, vocab_size=500, n_layer=4, n_head=4, n_embd=64)
    model = GPT(config)
    for name, p in model.named_parameters():
        values = p.detach().numpy()
        if name.endswith("c_proj.weight"):
            assert abs(values.std() / (0.02 / math.sqrt(2 * config.n_layer)) - 1) < 0.1, name
        elif name.endswith("weight") and p.ndim == 2:
            assert abs(values.std() / 0.02 - 1) < 0.1, name
        elif ".ln_" in name or "ln_f" in name:
            assert (values == (1.0 if name.endswith("weight") else 0.0)).all(), name
        else:
            assert (values == 0).all(), name  # Linear biases


def test_configure_optimizers_decays_only_matrices_and_steps_like_torch_adamw():
    model = tiny_model()
    twin = twin_of(model)
    opt = model.configure_optimizers(weight_decay=0.1, lr=1e-2, betas=(0.9, 0.95))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    named = dict(twin.named_parameters())
    t_opt = torch.optim.AdamW([{"params": [p for p in named.values() if p.dim() >= 2], "weight_decay": 0.1},
                               {"params": [p for p in named.values() if p.dim() < 2], "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.95))
    idx = tokens((2, 10), 37, 3)
    for _ in range(2):
        model(frost.tensor(idx), frost.tensor(idx))[1].backward()
        opt.step()
        opt.zero_grad()
        twin(torch.from_numpy(idx), torch.from_numpy(idx))[1].backward()
        t_opt.step()
        t_opt.zero_grad()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), named[name].detach().numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)


# ---------------------------------------------------------------- generation


def test_kv_cache_continues_the_full_forward():
    model = tiny_model().eval()
    idx = frost.tensor(tokens((2, 11), 37, 4))
    full = model.hidden_states(idx).detach().numpy()
    cache = KVCache(TINY.n_layer, TINY.block_size)
    with frost.no_grad():
        parts = [model.hidden_states(idx[:, :5], cache), model.hidden_states(idx[:, 5:8], cache),
                 model.hidden_states(idx[:, 8:9], cache), model.hidden_states(idx[:, 9:], cache)]
    np.testing.assert_allclose(np.concatenate([p.numpy() for p in parts], axis=1), full, rtol=1e-10, atol=1e-13)
    assert cache.length == 11
    with pytest.raises(RuntimeError, match="no_grad"):
        model.hidden_states(idx[:, :1], cache)


@pytest.mark.parametrize("top_k", [None, 4])
def test_generation_with_and_without_the_cache_gives_the_same_tokens(top_k):
    model = tiny_model()
    prompt = frost.tensor(tokens((2, 5), 37, 5))
    runs = []
    for use_cache in (True, False):
        frost.manual_seed(123)
        runs.append(model.generate(prompt, 20, temperature=1.0, top_k=top_k, use_cache=use_cache).numpy())
    assert runs[0].shape == (2, 25)  # past block_size=16: the context is cropped, the cache rebuilt
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0][:, :5], prompt.numpy())
    assert model.training  # the mode is restored


def test_greedy_generation_follows_the_twins_argmax():
    model = tiny_model()
    model.lm_head.weight.data *= 20  # sharp logits: no near-ties between the two implementations
    twin = twin_of(model)
    prompt = tokens((2, 3), 37, 6)
    ours = model.generate(frost.tensor(prompt), 18, temperature=0).numpy()
    seq = torch.from_numpy(prompt)
    for _ in range(18):
        next_token = twin(seq[:, -TINY.block_size:])[0][:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, next_token], dim=1)
    np.testing.assert_array_equal(ours, seq.numpy())
    frost.manual_seed(0)
    np.testing.assert_array_equal(model.generate(frost.tensor(prompt), 18, temperature=3.0, top_k=1).numpy(), ours)


def sampled_frequencies(model: GPT, prompt: np.ndarray, n: int, **kwargs) -> np.ndarray:
    frost.manual_seed(7)
    drawn = model.generate(frost.tensor(np.repeat(prompt, n, axis=0)), 1, **kwargs).numpy()[:, -1]
    return np.bincount(drawn, minlength=TINY.vocab_size) / n


@pytest.mark.parametrize("temperature, top_k", [(0.5, None), (2.0, None), (1.0, 5)])
def test_sampling_follows_softmax_of_logits_over_temperature_within_top_k(temperature, top_k):
    model = tiny_model()
    model.lm_head.weight.data *= 8
    twin = twin_of(model)
    prompt = tokens((1, 4), 37, 8)
    plain = twin(torch.from_numpy(prompt))[0][0, -1].detach()
    logits = plain / temperature
    if top_k is not None:
        logits[logits < logits.topk(top_k).values[-1]] = -math.inf
    expected = torch.softmax(logits, -1).numpy()
    # far from softmax(plain): a sampler that ignored temperature or top_k would fail
    assert np.abs(expected - torch.softmax(plain, -1).numpy()).max() > 0.1
    frequencies = sampled_frequencies(model, prompt, 4000, temperature=temperature, top_k=top_k)
    np.testing.assert_allclose(frequencies, expected, atol=0.035)  # 4000 draws: standard error <= 0.008
    assert np.count_nonzero(frequencies[expected == 0]) == 0


def test_generate_refuses_bad_arguments():
    model = tiny_model()
    prompt = frost.tensor(tokens((1, 3), 37, 0))
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(prompt, 2, top_k=0)
    with pytest.raises(TypeError, match="integer"):
        model.generate(frost.randn(1, 3), 2)


# ---------------------------------------------------------------- the Hugging Face GPT-2 layout


def hf_checkpoint(folder, config: GPTConfig, prefix: str, with_head: bool = False):
    """A model.safetensors (+ config.json) of a GPT-2 in the Hub's layout, and its PyTorch twin (float64)."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    torch.manual_seed(0)
    twin = TorchGPT(config, hf=True)
    tensors = {}
    for key, value in twin.state_dict().items():
        if key == "lm_head.weight" and not with_head:
            continue
        name = key.removeprefix("transformer.")
        tensors[(prefix + name) if key != "lm_head.weight" else key] = value.numpy().copy()
    path = folder / "model.safetensors"
    safetensors_numpy.save_file(tensors, str(path))
    (folder / "config.json").write_text(json.dumps({"n_head": config.n_head, "n_layer": config.n_layer}))
    return path, twin.double()


@pytest.mark.parametrize("prefix, with_head", [("", False), ("transformer.", True)])
def test_hugging_face_checkpoint_loads_and_gives_the_twins_logits(tmp_path, prefix, with_head):
    config = GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=16)  # n_head is not n_embd/64
    path, twin = hf_checkpoint(tmp_path, config, prefix, with_head)
    model = GPT.from_pretrained_safetensors(path)
    assert model.config == config
    idx = tokens((2, 9), 37, 9)
    ours = model.double()(frost.tensor(idx))[0].detach().numpy()
    np.testing.assert_allclose(ours, twin(torch.from_numpy(idx))[0].detach().numpy(), rtol=1e-10, atol=1e-13)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_hugging_face_loader_refuses_an_untied_head_and_a_wrong_config(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path, _ = hf_checkpoint(tmp_path, TINY, "transformer.", with_head=True)
    tensors = read_safetensors(path)
    with pytest.raises(RuntimeError, match="size mismatch"):
        GPT.from_pretrained_safetensors(path, GPTConfig(**{**TINY.__dict__, "n_embd": 32}))
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1
    safetensors_numpy.save_file(tensors, str(path))
    with pytest.raises(ValueError, match="untied"):
        GPT.from_pretrained_safetensors(path)


def test_safetensors_reader_checks_the_header_and_offsets(tmp_path):
    path, _ = hf_checkpoint(tmp_path, TINY, "")
    data = path.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[:-8])
    with pytest.raises(ValueError, match="truncated.safetensors is truncated: its tensors need"):
        read_safetensors(truncated)
    overlapping = tmp_path / "overlapping.safetensors"  # two names over the same bytes: one file read twice
    header = json.dumps({name: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]} for name in ("a", "b")})
    overlapping.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(8))
    with pytest.raises(ValueError, match="'b' spans bytes 0..8 of the data, overlapping"):
        read_safetensors(overlapping)
    huge_header = tmp_path / "huge.safetensors"
    huge_header.write_bytes((2 ** 40).to_bytes(8, "little") + data[8:])
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_safetensors(huge_header)
    frost.save({"w": frost.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="not a GPT-2 checkpoint"):
        GPT.from_pretrained_safetensors(tmp_path / "other.safetensors")


# ---------------------------------------------------------------- training


def test_a_tiny_gpt_overfits_a_tiny_text():
    text = "to be or not to be, that is the question. " * 4
    chars = sorted(set(text))
    data = np.array([chars.index(ch) for ch in text])
    config = GPTConfig(block_size=32, vocab_size=len(chars), n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    frost.manual_seed(0)
    model = GPT(config)
    opt = model.configure_optimizers(weight_decay=0.0, lr=1e-2, betas=(0.9, 0.99))
    rng = np.random.default_rng(0)
    first = None
    for _ in range(100):
        starts = rng.integers(0, len(data) - config.block_size - 1, size=8)
        x = np.stack([data[s:s + config.block_size] for s in starts])
        y = np.stack([data[s + 1:s + 1 + config.block_size] for s in starts])
        _, loss = model(frost.tensor(x), frost.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert first > 2.5 and loss.item() < 0.5, (first, loss.item())  # from ~ln(16) to memorized
