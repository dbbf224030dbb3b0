"""Tests for frost/text/bpe.py (and kernels.py through it): merges and encodings equal minbpe's, merge for merge."""
import random
import warnings

import numpy as np
import pytest

from frost.text import BPE, GPT2_PATTERN, GPT4_PATTERN, pretokenize

from . import corpora, reference

pytestmark = pytest.mark.timeout(120)  # the first run on a machine compiles the kernels


def train_quietly(text_or_files, vocab_size, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BPE.train(text_or_files, vocab_size, progress=False, **kwargs)


CASES = {
    "python source, gpt4": (corpora.python_source(), 480, "gpt4"),
    "zipf words, gpt2": (corpora.zipf_words(3000, seed=0), 420, "gpt2"),
    "mixed scripts, gpt4": (corpora.mixed_scripts(600, seed=1), 400, "gpt4"),
    "ties, gpt4": (corpora.tied(3000, seed=2), 330, "gpt4"),
    "ties, no split": (corpora.tied(1500, seed=3), 300, None),
    "overlapping runs, gpt2": (corpora.runs(), 300, "gpt2"),
    "custom pattern": (corpora.zipf_words(1500, seed=4), 320, r"\w+|\s+|[^\w\s]+"),
}


@pytest.mark.parametrize("name", CASES)
def test_merges_match_minbpe(name):
    text, vocab_size, pattern = CASES[name]
    tok = train_quietly(text, vocab_size, pattern=pattern)
    expected = reference.train([text], vocab_size - 256, pretokenize.resolve_pattern(pattern))
    assert tok.merges == expected
    assert tok.n_vocab == 256 + len(expected)
    assert tok.vocab[256 + 5] == tok.vocab[expected[5][0]] + tok.vocab[expected[5][1]]


def test_ties_go_to_the_pair_seen_first():
    # every pair occurs once: the merges follow the text; then (x y) and (y z) tie at 2 and "xy" comes first
    assert BPE.train("dcba", 259, pattern=None, progress=False).merges == [(100, 99), (256, 98), (257, 97)]
    tok = BPE.train("qxyz xyz", 257, pattern=None, progress=False)
    assert tok.merges == [(120, 121)]


def test_training_in_blocks_chunks_as_the_whole_text(monkeypatch):
    text = corpora.python_source()[:5000] + corpora.zipf_words(500, seed=5)
    for pattern in ("gpt4", "gpt2"):
        whole = BPE.train(text, 360, pattern=pattern, progress=False).merges
        monkeypatch.setattr(pretokenize, "BLOCK_CHARS", 97)
        assert BPE.train(text, 360, pattern=pattern, progress=False).merges == whole
        monkeypatch.undo()
        assert whole == reference.train([text], 104, pretokenize.resolve_pattern(pattern))


def test_training_on_worker_processes_gives_the_same_merges(monkeypatch):
    monkeypatch.setattr(pretokenize, "TASK_CHARS", 2000)
    text = corpora.zipf_words(2000, seed=20)
    assert BPE.train(text, 400, num_workers=2, progress=False).merges == \
        BPE.train(text, 400, num_workers=1, progress=False).merges
    with pytest.raises(ValueError, match="num_workers must be a positive int"):
        BPE.train(text, 400, num_workers=0, progress=False)


def test_empty_text_gives_the_byte_tokens_only():
    with pytest.warns(UserWarning, match="only 0 merges"):
        tok = BPE.train("", 300, progress=False)
    assert tok.merges == [] and tok.n_vocab == 256
    assert tok.encode("") == [] and tok.decode([]) == ""
    assert tok.encode("hé") == list("hé".encode())


def test_text_shorter_than_the_vocabulary_stops_when_no_pair_is_left():
    with pytest.warns(UserWarning, match=r"vocabulary has 267 tokens instead of 1000"):
        tok = BPE.train("hello world, hello!", 1000, special_tokens=["<|end|>"], progress=False)
    assert tok.merges == reference.train(["hello world, hello!"], 1000, GPT4_PATTERN)
    assert tok.special_tokens == {"<|end|>": 266} and tok.n_vocab == 267
    assert tok.encode("hello world") == reference.encode("hello world", tok.merges, GPT4_PATTERN)


def test_invalid_utf8_bytes_train_and_decode_as_tiktoken():
    rng = random.Random(6)
    noise = bytes(rng.randrange(256) for _ in range(3000))
    data = b"plain words " * 20 + noise + "caf\u00e9 \u00fc\u00fc".encode() + b"\xff\xfe\xc3 \xc3\xa9\xe2\x82" * 10
    tok = train_quietly(data, 400)
    text = data.decode("utf-8", errors="surrogateescape")
    assert tok.merges == reference.train([text], 144, GPT4_PATTERN)
    assert any(not _is_utf8(piece) for piece in tok.vocab.values())
    ids = reference.encode(text, tok.merges, GPT4_PATTERN)
    assert tok.decode_bytes(ids) == data
    assert tok.decode(ids) == data.decode("utf-8", errors="replace")


def _is_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_files_are_separate_documents(tmp_path, monkeypatch):
    first, second = corpora.zipf_words(600, seed=7), corpora.mixed_scripts(200, seed=8)
    (tmp_path / "a.txt").write_text(first, encoding="utf-8")
    (tmp_path / "b.txt").write_bytes(second.encode() + b"\x80\xfe tail")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CORPUS_DIR", str(tmp_path))
    tok = train_quietly(["~/a.txt", tmp_path / "b.txt"], 420)
    documents = [first, (second.encode() + b"\x80\xfe tail").decode("utf-8", errors="surrogateescape")]
    assert tok.merges == reference.train(documents, 164, GPT4_PATTERN)
    assert train_quietly(["$CORPUS_DIR/a.txt"], 300).merges == reference.train([first], 44, GPT4_PATTERN)


def test_special_tokens_split_the_text_take_the_last_ids_and_encode_as_tiktoken():
    documents = [corpora.zipf_words(400, seed=s) for s in range(3)]
    text = "<|endoftext|>".join(documents) + "<|pad|>"
    tok = BPE.train(text, 360, special_tokens=["<|endoftext|>", "<|pad|>"], progress=False)
    assert tok.merges == reference.train(documents, 102, GPT4_PATTERN)
    assert tok.special_tokens == {"<|endoftext|>": 358, "<|pad|>": 359} and tok.n_vocab == 360
    sample = "the word<|endoftext|>of the<|pad|>"
    plain = tok.encode_ordinary("the word") + [358] + tok.encode_ordinary("of the") + [359]
    assert tok.encode(sample, allowed_special="all") == plain
    with pytest.raises(ValueError, match="special token '<\\|endoftext\\|>'"):
        tok.encode(sample)
    with pytest.raises(ValueError, match="special token '<\\|pad\\|>'"):
        tok.encode(sample, allowed_special={"<|endoftext|>"})
    assert tok.encode(sample, allowed_special={"<|endoftext|>"}, disallowed_special=()) == \
        plain[:-1] + tok.encode_ordinary("<|pad|>")
    assert tok.encode(sample, allowed_special="none") == tok.encode_ordinary(sample)
    assert tok.decode(plain) == sample
    with pytest.raises(ValueError, match="not special tokens"):
        tok.encode(sample, allowed_special={"<|nope|>"})


def test_encode_matches_minbpe_on_unseen_text():
    tok = train_quietly(corpora.zipf_words(3000, seed=9) + corpora.mixed_scripts(300, seed=10), 600)
    for text in (corpora.zipf_words(500, seed=11), corpora.mixed_scripts(100, seed=12),
                 corpora.random_unicode(2000, seed=13), "a" * 3000, " " * 700 + "x", ""):
        assert tok.encode(text) == reference.encode(text, tok.merges, GPT4_PATTERN)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_inverts_encode_on_random_unicode(seed):
    tok = train_quietly(corpora.random_unicode(4000, seed=100 + seed) + corpora.zipf_words(500, seed=seed), 500,
                        pattern=[GPT4_PATTERN, GPT2_PATTERN, None][seed])
    for length in (0, 1, 7, 3000):
        text = corpora.random_unicode(length, seed=200 + seed + length)
        assert tok.decode(tok.encode(text)) == text


def test_lone_surrogates_become_the_replacement_character_as_in_tiktoken():
    tok = train_quietly(corpora.zipf_words(300, seed=14), 300)
    assert tok.encode("a\ud800b c") == tok.encode("a\ufffdb c")
    assert tok.encode("\ud83d\ude00") == tok.encode("\U0001F600")  # a surrogate pair joins, as tiktoken's fix-up


def test_encode_batch_matches_encode_on_threads():
    tok = train_quietly(corpora.zipf_words(2000, seed=15), 500, special_tokens=["<|s|>"])
    texts = [corpora.zipf_words(300, seed=s) + "<|s|>" for s in range(8)]
    expected = [tok.encode(t, allowed_special="all") for t in texts]
    assert tok.encode_batch(texts, num_threads=2, allowed_special="all") == expected
    assert tok.encode_batch(texts, num_threads=1, allowed_special="all") == expected
    with pytest.raises(ValueError, match="special token"):
        tok.encode_batch(texts, num_threads=2)
    with pytest.raises(ValueError, match="num_threads must be positive"):
        tok.encode_batch(texts, num_threads=0)


def test_the_encoding_cache_starts_over_when_full(monkeypatch):
    tok = train_quietly(corpora.zipf_words(2000, seed=16), 400)
    monkeypatch.setattr("frost.text.bpe.CACHE_LIMIT", 10)
    text = corpora.zipf_words(500, seed=17)
    assert tok.encode(text) == reference.encode(text, tok.merges, GPT4_PATTERN)
    assert len(tok._cache) <= 200


def test_bad_arguments_are_refused_with_the_argument_named(tmp_path):
    with pytest.raises(ValueError, match="vocab_size must be an int >= 256"):
        BPE.train("abc", 255, progress=False)
    with pytest.raises(ValueError, match="vocab_size must be an int >= 256 \\+ 2"):
        BPE.train("abc", 257, special_tokens=["<a>", "<b>"], progress=False)
    with pytest.raises(ValueError, match="special_tokens must be non-empty strings"):
        BPE.train("abc", 300, special_tokens=[""], progress=False)
    with pytest.raises(FileNotFoundError, match="no such file"):
        BPE.train([tmp_path / "missing.txt"], 300, progress=False)
    with pytest.raises(TypeError, match="text_or_files"):
        BPE.train([1, 2], 300, progress=False)
    with pytest.raises(ValueError, match="not a valid regex"):
        BPE.train("abc", 300, pattern="(", progress=False)
    tok = train_quietly("abcabc", 300)
    for bad in (-1, tok.n_vocab, "a", 2.5):
        with pytest.raises(ValueError, match=f"BPE.decode: {bad!r} is not a token id"):
            tok.decode([97, bad])
    with pytest.raises(TypeError, match="BPE.encode: text must be a str"):
        tok.encode(b"abc")
    with pytest.raises(ValueError, match="allowed_special must be"):
        tok.encode("abc", allowed_special="some")
    with pytest.raises(ValueError, match="merge 0 .* uses a token not made before it"):
        BPE([(97, 256)])
    with pytest.raises(ValueError, match="byte_ids must be a permutation"):
        BPE(byte_ids=[0] * 256)


def test_progress_bars_go_to_stderr(capsys):
    BPE.train(corpora.zipf_words(200, seed=18), 300, progress=True)
    err = capsys.readouterr().err
    assert "BPE chunks" in err and "BPE merges" in err


def test_vocab_and_decode_table_agree():
    tok = train_quietly(corpora.zipf_words(1000, seed=19), 400, special_tokens=["<|e|>"])
    ids = np.arange(tok.n_vocab)
    assert tok.decode_bytes(ids) == b"".join(tok.vocab[i] for i in range(tok.n_vocab))
    assert tok.vocab[399] == b"<|e|>" and all(len(tok.vocab[i]) == 1 for i in range(256))
