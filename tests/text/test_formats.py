"""Tests for frost/text/formats.py: Frost's file, tiktoken rank files and tokenizer.json load and encode alike."""
import base64
import random
import warnings

import pytest

from frost.text import BPE, formats

from . import corpora

SPECIALS = ["<|endoftext|>", "<|fim|>"]


@pytest.fixture(scope="module")
def tok():
    text = corpora.zipf_words(3000, seed=0) + corpora.mixed_scripts(400, seed=1) + corpora.python_source()
    return BPE.train(text, 700, special_tokens=SPECIALS, progress=False)


def samples():
    """Texts the exports must encode as Frost does: seen and unseen words, code, every script, random code points."""
    return [corpora.zipf_words(400, seed=2), corpora.mixed_scripts(100, seed=3), corpora.python_source()[:3000],
            corpora.random_unicode(1500, seed=4), "a" * 500, "  \n\n \t x", "",
            "one<|endoftext|>two <|fim|><|endoftext|>"]


def permuted_bytes(tok: BPE, seed: int) -> BPE:
    """The same tokenizer with its 256 byte tokens renumbered (as cl100k numbers them)."""
    perm = list(range(256))
    random.Random(seed).shuffle(perm)
    relabel = lambda i: perm[i] if i < 256 else i  # noqa: E731
    merges = [(relabel(a), relabel(b)) for a, b in tok.merges]
    return BPE(merges, tok.pattern, tok.special_tokens, byte_ids=perm)


def test_frost_format_round_trips(tmp_path, tok):
    for original in (tok, permuted_bytes(tok, 0), BPE([(97, 98)], None, {'"q" \\ <s>': 300}),
                     BPE([(32, 32)], r"\p{L}+|[ \t]+", {})):
        original.save(tmp_path / "t.bpe")
        loaded = BPE.load(tmp_path / "t.bpe")
        assert (loaded.merges, loaded.pattern, loaded.special_tokens, loaded.byte_ids) == \
            (original.merges, original.pattern, original.special_tokens, original.byte_ids)
    assert [p.name for p in tmp_path.iterdir()] == ["t.bpe"]  # written atomically, no temporary left
    lines = (tmp_path / "t.bpe").read_text().splitlines()
    assert lines == ["frost-bpe 1", 'pattern "\\\\p{L}+|[ \\\\t]+"', "bytes identity", "special 0", "merges 1",
                     "32 32"]


def test_frost_format_errors_name_the_file_and_line(tmp_path, tok):
    tok.save(tmp_path / "t.bpe")
    good = (tmp_path / "t.bpe").read_text().split("\n")
    for line, broken, message in [(0, "frost-bpe 9", "line 1: not a Frost BPE file"),
                                  (1, "pattern [", "line 2: the pattern must be JSON"),
                                  (3, "special x", "line 4: special needs a count"),
                                  (8, "1 2 3", "line 9: a merge line is"),
                                  (4, "<|endoftext|> 698", "line 5: a special token must be JSON")]:
        lines = list(good)
        lines[line] = broken
        (tmp_path / "bad.bpe").write_text("\n".join(lines))
        with pytest.raises(ValueError, match=f"bad.bpe, {message}"):
            BPE.load(tmp_path / "bad.bpe")
    (tmp_path / "short.bpe").write_text("\n".join(good[:20]))
    with pytest.raises(ValueError, match="short.bpe, line 21"):
        BPE.load(tmp_path / "short.bpe")


def test_tiktoken_loads_the_rank_file_and_encodes_as_frost(tmp_path, monkeypatch, tok):
    tiktoken = pytest.importorskip("tiktoken")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken caches even local files, by path
    load_tiktoken_bpe = pytest.importorskip("tiktoken.load").load_tiktoken_bpe
    for variant in (tok, permuted_bytes(tok, 1)):
        variant.save_tiktoken(tmp_path / "ranks.tiktoken")
        encoding = tiktoken.Encoding("frost", pat_str=variant.pattern, special_tokens=variant.special_tokens,
                                     mergeable_ranks=load_tiktoken_bpe(str(tmp_path / "ranks.tiktoken")))
        for text in samples():
            ids = variant.encode(text, allowed_special="all")
            assert encoding.encode(text, allowed_special="all") == ids
            assert encoding.decode(ids) == variant.decode(ids) == text
        assert encoding.decode_bytes(list(range(variant.n_vocab))) == variant.decode_bytes(range(variant.n_vocab))


def test_from_tiktoken_recovers_the_merges_and_byte_order(tmp_path, tok):
    for variant in (tok, permuted_bytes(tok, 2)):
        variant.save_tiktoken(tmp_path / "ranks.tiktoken")
        loaded = BPE.from_tiktoken(tmp_path / "ranks.tiktoken", special_tokens=variant.special_tokens)
        assert (loaded.merges, loaded.byte_ids) == (variant.merges, variant.byte_ids)
        text = corpora.mixed_scripts(50, seed=5)
        assert loaded.encode(text) == variant.encode(text)


def test_from_tiktoken_refuses_what_is_not_a_bpe_rank_file(tmp_path):
    (tmp_path / "text.tiktoken").write_text("not base64 at all\n")
    with pytest.raises(ValueError, match="text.tiktoken, line 1: expected '<base64> <rank>'"):
        BPE.from_tiktoken(tmp_path / "text.tiktoken")
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    (tmp_path / "gap.tiktoken").write_text("\n".join(lines + ["YWJj 300"]))
    with pytest.raises(ValueError, match="the ranks must be 0..256"):
        BPE.from_tiktoken(tmp_path / "gap.tiktoken")
    (tmp_path / "abc.tiktoken").write_text("\n".join(lines + ["YWJj 256"]))  # "abc" with no "ab" or "bc" below it
    with pytest.raises(ValueError, match="token 256 b'abc' is not a merge of two lower-ranked tokens"):
        BPE.from_tiktoken(tmp_path / "abc.tiktoken")


def test_huggingface_tokenizer_json_loads_and_encodes_as_frost(tmp_path, tok):
    tokenizers = pytest.importorskip("tokenizers")
    for variant in (tok, permuted_bytes(tok, 3), BPE(tok.merges, None, tok.special_tokens)):
        variant.save_huggingface(tmp_path / "tokenizer.json")
        hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
        for text in samples():
            ids = variant.encode(text, allowed_special="all")
            assert hf.encode(text).ids == ids
            assert hf.decode(ids, skip_special_tokens=False) == text


def test_exports_refuse_two_tokens_with_the_same_bytes(tmp_path):
    # "abc" made twice: (ab, c) and (a, bc); a rank file or a vocab maps bytes to one id
    tok = BPE([(97, 98), (256, 99), (98, 99), (97, 258)], None)
    with pytest.raises(ValueError, match="tokens 257 and 259 have the same bytes b'abc'"):
        tok.save_tiktoken(tmp_path / "t.tiktoken")
    with pytest.raises(ValueError, match="save_huggingface: tokens 257 and 259"):
        tok.save_huggingface(tmp_path / "t.json")


def test_byte_to_unicode_is_gpt2s_printable_map():
    mapping = formats.byte_to_unicode()
    assert len(set(mapping.values())) == 256
    assert mapping[ord(" ")] == "Ġ" and mapping[ord("\n")] == "Ċ" and mapping[ord("A")] == "A"


def test_paths_expand_the_home_directory(tmp_path, monkeypatch, tok):
    monkeypatch.setenv("HOME", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok.save("~/t.bpe")
    assert BPE.load(tmp_path / "t.bpe").merges == tok.merges
