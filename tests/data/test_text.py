"""Tests for frost/data/text.py: the token file (atomic .npy, uint16/uint32), encoding a corpus once, block sampling."""
import os

import numpy as np
import pytest

from frost.data import DataLoader, TokenDataset
from frost.data.text import token_dtype, write_tokens
from frost.text import BPE

CORPUS = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
          "First Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 20


class CountingTokenizer:
    """A stand-in with tiktoken's interface: ids are the bytes, plus an offset (to exceed uint16)."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab

    def encode_ordinary(self, text: str) -> list[int]:
        return [self.n_vocab - 256 + b for b in text.encode()]

    def encode(self, text: str, allowed_special="none_raise") -> list[int]:
        return [0] + self.encode_ordinary(text)


@pytest.fixture(scope="module")
def tok():
    return BPE.train(CORPUS, 300, special_tokens=["<|endoftext|>"], progress=False)


def test_write_tokens_writes_a_npy_file_numpy_reads(tmp_path):
    path = write_tokens(tmp_path / "t.npy", [[1, 2, 3], np.array([65535], np.int64), []], 65536)
    tokens = np.load(path)
    assert tokens.dtype == np.uint16 and tokens.tolist() == [1, 2, 3, 65535]
    path = write_tokens(tmp_path / "u.npy", [[70000]], 70001)
    assert np.load(path).dtype == np.uint32 and np.load(path).tolist() == [70000]
    assert write_tokens(tmp_path / "e.npy", [], 10) and np.load(tmp_path / "e.npy").shape == (0,)
    assert token_dtype(2 ** 16) == np.uint16 and token_dtype(2 ** 16 + 1) == np.uint32


def test_a_failed_write_leaves_no_file_and_keeps_the_old_one(tmp_path):
    write_tokens(tmp_path / "t.npy", [[1, 2]], 10)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 10\), got \[3, 10\]"):
        write_tokens(tmp_path / "t.npy", [[1, 2], [3, 10]], 10)
    assert sorted(os.listdir(tmp_path)) == ["t.npy"]
    assert np.load(tmp_path / "t.npy").tolist() == [1, 2]


def test_encode_to_file_encodes_each_document_once_with_separators(tmp_path, tok, monkeypatch):
    files = []
    for i, text in enumerate([CORPUS[:500], "hear me <|endoftext|> speak", CORPUS[500:900]]):
        (tmp_path / f"{i}.txt").write_text(text, encoding="utf-8")
        files.append(tmp_path / f"{i}.txt")
    monkeypatch.setenv("DATA", str(tmp_path))
    eot = tok.special_tokens["<|endoftext|>"]
    path = TokenDataset.encode_to_file(tok, [files[0], "$DATA/1.txt", str(files[2])], "$DATA/train.npy",
                                       separator=eot, num_threads=2)
    assert path == str(tmp_path / "train.npy")
    expected = []
    for f in files:
        expected += tok.encode_ordinary(f.read_text()) + [eot]
    assert np.load(path).tolist() == expected
    allowed = TokenDataset.encode_to_file(tok, [files[1]], tmp_path / "a.npy", allowed_special="all")
    assert np.load(allowed).tolist() == tok.encode("hear me <|endoftext|> speak", allowed_special="all")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.txt", "1.txt", "2.txt", "a.npy", "train.npy"]


def test_encode_to_file_takes_a_text_and_any_tokenizer_with_tiktokens_interface(tmp_path):
    path = TokenDataset.encode_to_file(CountingTokenizer(100_000), "héllo", tmp_path / "t.npy", separator=7)
    tokens = np.load(path)
    assert tokens.dtype == np.uint32 and tokens.tolist() == [99_744 + b for b in "héllo".encode()] + [7]
    with pytest.raises(ValueError, match="separator 100000 is not a token id"):
        TokenDataset.encode_to_file(CountingTokenizer(100_000), "x", tmp_path / "t.npy", separator=100_000)
    with pytest.raises(TypeError, match="expected a text or file paths"):
        TokenDataset.encode_to_file(CountingTokenizer(300), [3], tmp_path / "t.npy")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    with pytest.raises(ValueError, match="latin1.txt is not UTF-8 text"):
        TokenDataset.encode_to_file(CountingTokenizer(300), [tmp_path / "latin1.txt"], tmp_path / "t.npy")


def test_the_file_is_memory_mapped_and_sampled_in_next_token_blocks(tmp_path, tok, monkeypatch):
    path = TokenDataset.encode_to_file(tok, CORPUS, tmp_path / "train.npy")
    monkeypatch.setenv("HOME", str(tmp_path))
    ds = TokenDataset.from_file("~/train.npy", block_size=16)
    assert isinstance(ds.tokens.base, np.memmap) or isinstance(ds.tokens, np.memmap)
    tokens = np.load(path)
    x, y = ds.sample(8, np.random.default_rng(0))
    starts = np.random.default_rng(0).integers(0, len(ds), size=8)
    assert x.dtype == np.int64 and x.shape == y.shape == (8, 16)
    np.testing.assert_array_equal(x, tokens[starts[:, None] + np.arange(16)])
    np.testing.assert_array_equal(y, tokens[starts[:, None] + np.arange(1, 17)])
    xb, yb = next(iter(DataLoader(ds, batch_size=4, shuffle=True, seed=0)))
    np.testing.assert_array_equal(xb.numpy()[:, 1:], yb.numpy()[:, :-1])
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        ds.sample(0)
