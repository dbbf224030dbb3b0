"""BPE training and encoding speed: frost.text.BPE against Hugging Face `tokenizers`, minbpe's algorithm and tiktoken.

    python benchmarks/bpe.py --corpus PATH/tinyshakespeare/input.txt            # 1 MB at vocab 4,096
    python benchmarks/bpe.py --corpus PATH/input.txt --large --out bpe.json     # + ~100 MB at vocab 32,768

Training (seconds, wall clock, best of --repeats):
  frost       frost.text.BPE.train on the file (GPT-4 split pattern), with its phases: reading + chunk
              counting, then the merges. The compiled kernels are loaded (or compiled) by a warm-up first;
              the first-call cost on a fresh machine is printed apart.
  tokenizers  Hugging Face's BpeTrainer: models.BPE, pre-tokenizer Sequence[Split(the same regex,
              isolated), ByteLevel(use_regex=False)], the 256-byte initial alphabet, the same vocab size,
              training from the file (its fast path, which reads it line by line, on all cores).
  minbpe      minbpe's RegexTokenizer algorithm (recount every pair of every chunk occurrence, merge the
              most frequent), too slow to run whole (quadratic: an hour on tinyshakespeare): it runs
              --minbpe-merges merges from 4 points of the training (the chunks as Frost's first k merges
              leave them, k at 1/8, 3/8, 5/8, 7/8 of the merges), and the total is the midpoint-rule
              estimate from those 4 per-merge times; its merges there must equal Frost's (checked).
              Skipped on the large corpus unless --large-minbpe-merges (its chunk lists need ~10 GB).
Encoding (MB/s of UTF-8 text, best of --repeats), Frost's merges exported to tiktoken's rank format:
  single      one call on the whole text (Frost: encode_ordinary, first call with an empty chunk cache
              and again with it warm; tiktoken: encode_ordinary)
  batch       the text cut into ~1 MB blocks at chunk boundaries, encode_batch / encode_ordinary_batch
              on all cores
and whether every encoding equals Frost's (where not, the text of the first difference: so far always a
character that the regex engines' Unicode versions classify differently, e.g. U+A7CF).

The large corpus (--large) is built from the text that ships with the running Python: the standard
library's .py/.txt/.rst/.md files, then the site-packages' ones, in sorted path order, each decoded as
UTF-8 (bad bytes replaced by U+FFFD), concatenated up to --large-mb (100) megabytes; so it depends on
the machine's Python and packages, and the JSON records its size, file count and SHA-256. It is
written to a temporary folder and removed afterwards (--large-corpus PATH uses an existing file instead).

Prints a table; --out FILE.json also writes the results as JSON. The machine's core count and load
average are printed and recorded: timings on a shared machine vary with its other work.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import regex

import frost
from frost.text import BPE, bpe, pretokenize
from frost.text.formats import byte_to_unicode

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "text" / "reference.py"

try:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
except ImportError:  # its rows are left out
    tiktoken = None
try:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
except ImportError:  # its rows are left out
    Tokenizer = None

TEXT_SUFFIXES = (".py", ".txt", ".rst", ".md")


def build_large_corpus(path: Path, megabytes: float) -> dict:
    """Concatenates the Python installation's text files into `path`; returns how (size, files, sha256)."""
    target = int(megabytes * 1e6)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    files = [p for p in sorted(stdlib.rglob("*")) if "site-packages" not in p.parts]
    files += sorted(site.rglob("*"))
    digest, written, used = hashlib.sha256(), 0, 0
    with open(path, "wb") as out:
        for file in files:
            if written >= target:
                break
            if file.suffix not in TEXT_SUFFIXES or not file.is_file():
                continue
            # valid UTF-8 only (tokenizers refuses anything else): bad bytes become U+FFFD, a cut character goes
            data = file.read_bytes().decode("utf-8", errors="replace").encode("utf-8")[:target - written]
            data = data.decode("utf-8", errors="ignore").encode("utf-8")
            out.write(data)
            digest.update(data)
            written += len(data)
            used += 1
    sources = [f"the Python {sys.version.split()[0]} standard library", "the environment's site-packages"]
    return {"bytes": written, "files": used, "sha256": digest.hexdigest(), "from": sources}


def best_of(repeats: int, run) -> tuple[float, object]:
    """(best wall seconds, the last result) of `repeats` calls."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


# ---- trainers -----------------------------------------------------------------------------------------------

def train_frost(path: Path, vocab_size: int, repeats: int, workers: int | None) -> dict:
    warm_start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BPE.train("warm up the kernels " * 10, 300, progress=False)
    warm = time.perf_counter() - warm_start

    def phases():
        start = time.perf_counter()
        documents, size, _ = bpe.documents_of([path])
        workers_used = workers or ((os.cpu_count() or 1) if size >= bpe.PARALLEL_MIN_SIZE else 1)
        counts = pretokenize.count_chunks(documents, pretokenize.GPT4_PATTERN, workers=workers_used)
        counted = time.perf_counter()
        merges = bpe.train_merges(counts, vocab_size - 256, progress=False)
        return {"count_seconds": counted - start, "merge_seconds": time.perf_counter() - counted,
                "unique_chunks": len(counts), "workers": workers_used, "merges": merges}

    seconds, tok = best_of(repeats, lambda: BPE.train([path], vocab_size, progress=False, num_workers=workers))
    split = phases()
    return {"seconds": seconds, "first_call_seconds": warm, "tokenizer": tok, **split}


def train_tokenizers(path: Path, vocab_size: int, repeats: int) -> dict:
    def run():
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pretokenize.GPT4_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train([str(path)], trainer=trainer)
        return tokenizer

    seconds, tokenizer = best_of(repeats, run)
    return {"seconds": seconds, "tokenizer": tokenizer}


def load_reference():
    """minbpe's algorithm written out plainly: tests/text/reference.py's, the oracle Frost's merges are tested
    against."""
    spec = importlib.util.spec_from_file_location("frost_minbpe_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


minbpe = load_reference()


def minbpe_merges(chunks: list[list[int]], num_merges: int, first_id: int) -> list[tuple[int, int]]:
    """minbpe's RegexTokenizer.train loop: recount all pairs, merge the most frequent (first seen among equals)."""
    merges = []
    for i in range(num_merges):
        stats: dict = {}
        for ids in chunks:
            minbpe.get_stats(ids, stats)
        if not stats:
            break
        pair = max(stats, key=stats.get)
        merges.append(pair)
        chunks = [minbpe.merge(ids, pair, first_id + i) for ids in chunks]
    return merges


def train_minbpe(text: str, merges: list[tuple[int, int]], merges_per_sample: int, samples: int = 4) -> dict:
    """minbpe's time for all merges, estimated from `samples` short runs spread over the training."""
    chunks = regex.findall(pretokenize.GPT4_PATTERN, text)
    per_merge, equal, measured = [], True, 0.0
    for sample in range(samples):
        done = (2 * sample + 1) * len(merges) // (2 * samples)
        prefix = BPE(merges[:done], pattern=None)  # one chunk = one piece: the chunk's state after `done` merges
        state = {c: prefix.encode_ordinary(c) for c in dict.fromkeys(chunks)}
        start = time.perf_counter()
        found = minbpe_merges([state[c] for c in chunks], merges_per_sample, 256 + done)
        seconds = time.perf_counter() - start
        measured += seconds
        per_merge.append(seconds / max(len(found), 1))
        equal = equal and found == merges[done:done + len(found)]
    return {"seconds": sum(per_merge) / samples * len(merges), "seconds_measured": measured,
            "merges_run": merges_per_sample * samples, "per_merge_seconds": per_merge, "merges_equal_frost": equal}


# ---- encoding -----------------------------------------------------------------------------------------------

def tiktoken_encoding(tok: BPE, folder: Path):
    path = folder / "ranks.tiktoken"
    tok.save_tiktoken(path)
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken would cache the file by its path
    return tiktoken.Encoding("frost", pat_str=tok.pattern, mergeable_ranks=load_tiktoken_bpe(str(path)),
                             special_tokens={})


def encode_rates(tok: BPE, text: str, folder: Path, repeats: int) -> dict:
    megabytes = len(text.encode("utf-8", errors="surrogateescape")) / 1e6
    pieces = list(pretokenize.blocks(text, tok.pattern))
    tok._cache.clear()
    start = time.perf_counter()
    reference = tok.encode_ordinary(text)
    cold = time.perf_counter() - start
    warm, _ = best_of(repeats, lambda: tok.encode_ordinary(text))
    batch, frost_batch = best_of(repeats, lambda: tok.encode_batch(pieces, allowed_special="none"))
    result = {"megabytes": megabytes, "tokens": len(reference), "cores": os.cpu_count(),
              "frost_cold_mb_s": megabytes / cold, "frost_mb_s": megabytes / warm,
              "frost_batch_mb_s": megabytes / batch,
              "frost_batch_identical": [i for ids in frost_batch for i in ids] == reference}
    if tiktoken is None:
        return result
    encoding = tiktoken_encoding(tok, folder)
    single, ids = best_of(repeats, lambda: encoding.encode_ordinary(text))
    batch, batched = best_of(repeats, lambda: encoding.encode_ordinary_batch(pieces))
    result.update({"tiktoken_mb_s": megabytes / single, "tiktoken_batch_mb_s": megabytes / batch,
                   "tiktoken_identical": ids == reference and [i for b in batched for i in b] == reference})
    if ids != reference:
        result["tiktoken_first_difference"] = first_difference(tok, reference, ids)
    return result


def first_difference(tok: BPE, ours: list[int], theirs: list[int]) -> str:
    """The text around the first token where two encodings part (a regex engine's Unicode version, so far)."""
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return tok.decode(ours[max(at - 3, 0):at + 3])


# ---- the report ---------------------------------------------------------------------------------------------

def hf_vocabulary(tokenizer) -> set[bytes]:
    """The byte strings of a byte-level `tokenizers` vocabulary."""
    decode = {c: b for b, c in byte_to_unicode().items()}
    return {bytes(decode[c] for c in token) for token in tokenizer.get_vocab()}


def run_corpus(name: str, path: Path, vocab_size: int, args, folder: Path, minbpe_merges_per_sample: int) -> dict:
    text = pretokenize.read_document(path)
    print(f"{name}: {path.stat().st_size / 1e6:.1f} MB, vocab {vocab_size}", flush=True)
    frost_run = train_frost(path, vocab_size, args.repeats, args.workers)
    tok = frost_run.pop("tokenizer")
    merges = frost_run.pop("merges")
    row = {"corpus": name, "megabytes": path.stat().st_size / 1e6, "vocab_size": vocab_size,
           "frost": frost_run, "frost_merges": len(merges)}
    if Tokenizer is not None:
        hf = train_tokenizers(path, vocab_size, args.repeats)
        shared = len(hf_vocabulary(hf.pop("tokenizer")) & set(tok.vocab.values())) / vocab_size
        row["tokenizers"] = {**hf, "shared_vocabulary": shared}
    if minbpe_merges_per_sample:
        row["minbpe"] = train_minbpe(text, merges, minbpe_merges_per_sample)
    row["encode"] = encode_rates(tok, text, folder, args.repeats)
    return row


def print_table(rows: list[dict]) -> None:
    print(f"\n{'corpus':<16} {'vocab':>6} {'trainer':<11} {'seconds':>9}  notes")
    for row in rows:
        f = row["frost"]
        print(f"{row['corpus']:<16} {row['vocab_size']:>6} {'frost':<11} {f['seconds']:>9.2f}  chunks "
              f"{f['count_seconds']:.2f} s on {f['workers']} process(es) ({f['unique_chunks']} unique), merges "
              f"{f['merge_seconds']:.2f} s; first call {f['first_call_seconds']:.1f} s")
        if row.get("tokenizers"):
            t = row["tokenizers"]
            print(f"{'':<16} {'':>6} {'tokenizers':<11} {t['seconds']:>9.2f}  "
                  f"{t['shared_vocabulary']:.1%} of its vocabulary is also Frost's")
        if row.get("minbpe"):
            m = row["minbpe"]
            print(f"{'':<16} {'':>6} {'minbpe':<11} {m['seconds']:>9.1f}  estimated from {m['merges_run']} "
                  f"merges run in {m['seconds_measured']:.1f} s; they equal Frost's: {m['merges_equal_frost']}")
    print(f"\n{'corpus':<16} {'encoder':<22} {'MB/s':>8} {'batch MB/s':>11}  identical to Frost")
    for row in rows:
        e = row["encode"]
        print(f"{row['corpus']:<16} {'frost (cold cache)':<22} {e['frost_cold_mb_s']:>8.2f}")
        print(f"{'':<16} {'frost':<22} {e['frost_mb_s']:>8.2f} {e['frost_batch_mb_s']:>11.2f}  "
              f"batch: {e['frost_batch_identical']}")
        if "tiktoken_mb_s" in e:
            print(f"{'':<16} {'tiktoken (same ranks)':<22} {e['tiktoken_mb_s']:>8.2f} {e['tiktoken_batch_mb_s']:>11.2f}"
                  f"  {e['tiktoken_identical']}" + (f", first at {e['tiktoken_first_difference']!r}"
                                                    if "tiktoken_first_difference" in e else ""))


def environment() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    versions = {}
    for name in ("numpy", "numba", "regex", "tokenizers", "tiktoken"):
        try:
            versions[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            versions[name] = None
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.node(), "cpu": platform.processor(),
            "cores": os.cpu_count(), "python": platform.python_version(), "frost": frost.__version__,
            "commit": commit, "versions": versions, "load_average_start": os.getloadavg()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, help="a text file (tinyshakespeare's input.txt), at --vocab")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--large", action="store_true", help="also the ~100 MB corpus at --large-vocab")
    parser.add_argument("--large-vocab", type=int, default=32768)
    parser.add_argument("--large-mb", type=float, default=100)
    parser.add_argument("--large-corpus", type=Path, help="an existing file for the large run")
    parser.add_argument("--minbpe-merges", type=int, default=5, help="minbpe merges per sample (0: skip minbpe)")
    parser.add_argument("--large-minbpe-merges", type=int, default=0, help="the same on the large corpus")
    parser.add_argument("--workers", type=int, default=None, help="Frost's chunk-counting processes")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.corpus is None and not args.large:
        parser.error("give --corpus FILE and/or --large")
    env = environment()
    print(f"{env['cores']} cores, load average {env['load_average_start'][0]:.1f}; {env['date']}")
    for given in (args.corpus, args.large_corpus):
        if given is not None and not given.is_file():
            parser.error(f"{given} is not a file")
    rows = []
    with tempfile.TemporaryDirectory(prefix="frost-bpe-") as tmp:
        folder = Path(tmp)
        if args.corpus is not None:
            rows.append(run_corpus(args.corpus.name, args.corpus, args.vocab, args, folder, args.minbpe_merges))
        if args.large:
            large = args.large_corpus
            if large is None:
                large = folder / "python-text.txt"
                env["large_corpus"] = build_large_corpus(large, args.large_mb)
            rows.append(run_corpus(f"python text {args.large_mb:g}MB", large, args.large_vocab, args, folder,
                                   args.large_minbpe_merges))
    env["load_average_end"] = os.getloadavg()
    print_table(rows)
    result = {"environment": env, "runs": rows}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1, default=lambda o: o.tolist() if isinstance(
            o, np.ndarray) else str(o)) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
