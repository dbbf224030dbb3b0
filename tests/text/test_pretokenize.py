"""Tests for frost/text/pretokenize.py: patterns, safe block splits, chunk counting order."""
import random

import pytest
import regex

from frost.text import GPT2_PATTERN, GPT4_PATTERN, pretokenize

from . import corpora

# the characters where the patterns' alternatives meet: line breaks, other whitespace, letters, digits, marks
ALPHABET = ["\n", "\r", " ", " ", " ", "\t", "\u3000", "\x0b", "a", "b", "Z", "é", "1", "22", ".", "!", "'s", "'",
            "'LL", "\u0301", "😀", "\n\n", "  \n"]


def fuzz_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


@pytest.mark.parametrize("pattern", [GPT4_PATTERN, GPT2_PATTERN])
def test_blocks_chunk_exactly_as_the_whole_text(pattern):
    compiled = regex.compile(pattern)
    rng = random.Random(0)
    cut_somewhere = 0
    for trial in range(300):
        text = fuzz_text(rng, rng.randint(0, 120))
        for block_chars in (1, 3, 10):
            pieces = list(pretokenize.blocks(text, pattern, block_chars))
            assert "".join(pieces) == text
            assert [c for piece in pieces for c in compiled.findall(piece)] == compiled.findall(text), (text, pieces)
            cut_somewhere += len(pieces) > 1
    assert cut_somewhere > 300  # the splits were exercised


def test_blocks_leave_a_custom_pattern_whole():
    text = corpora.zipf_words(300, seed=0)
    assert list(pretokenize.blocks(text, r"\w+|\W", 10)) == [text]
    assert len(list(pretokenize.blocks(text, GPT4_PATTERN, 10))) > 10


def test_patterns_resolve_by_name():
    assert pretokenize.resolve_pattern("gpt4") == GPT4_PATTERN
    assert pretokenize.resolve_pattern("gpt2") == GPT2_PATTERN
    assert pretokenize.resolve_pattern(None) is None
    assert pretokenize.resolve_pattern(r"\w+") == r"\w+"
    with pytest.raises(ValueError, match="not a valid regex"):
        pretokenize.resolve_pattern("[")
    with pytest.raises(TypeError, match="pattern must be"):
        pretokenize.resolve_pattern(3)


def test_gpt4_pattern_splits_as_tiktoken_documents_it():
    chunks = regex.findall(GPT4_PATTERN, "Hello world's 12345 text!!\n\n  indented   x")
    assert chunks == ["Hello", " world", "'s", " ", "123", "45", " text", "!!\n\n", " ", " indented", "  ", " x"]


def test_counts_keep_first_occurrence_order_and_stop_at_specials():
    counts = pretokenize.count_chunks(["b a b<|s|>a c", "c b"], GPT4_PATTERN, ["<|s|>"])
    assert list(counts.items()) == [("b", 1), (" a", 1), (" b", 2), ("a", 1), (" c", 1), ("c", 1)]
    assert pretokenize.count_chunks(["ab", "", "ab"], None) == {"ab": 2}


def test_text_is_cleaned_as_tiktoken_cleans_it():
    assert pretokenize.clean_text("ok") == "ok"
    assert pretokenize.clean_text("a\udc80b") == "a\ufffdb"


def test_counting_in_processes_gives_the_same_counts_in_the_same_order(monkeypatch):
    documents = [corpora.zipf_words(2000, seed=1), "", corpora.python_source(), corpora.mixed_scripts(300, seed=2)]
    serial = pretokenize.count_chunks(documents, GPT4_PATTERN, ["<|s|>"])
    monkeypatch.setattr(pretokenize, "TASK_CHARS", 1000)
    monkeypatch.setattr(pretokenize, "BLOCK_CHARS", 300)
    done = []
    parallel = pretokenize.count_chunks(documents, GPT4_PATTERN, ["<|s|>"], progress=done.append, workers=2)
    assert list(parallel.items()) == list(serial.items())
    assert sum(done) == sum(map(len, documents)) and len(done) > 10
