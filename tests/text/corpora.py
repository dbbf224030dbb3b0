"""Small deterministic corpora for the BPE tests: code, Zipf-distributed words, mixed scripts, ties, byte noise."""
import inspect
import json
import random

WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more write "
         "go see number no way could people my than first water been call who oil its now find long down day did "
         "get come made may part").split()
SCRIPTS = ("Grüße aus Köln, naïve café. Здравствуй, мир! Γειά σου κόσμε. שלום עולם. مرحبا بالعالم. "
           "こんにちは世界。你好，世界！안녕하세요 세계. नमस्ते दुनिया। 🎉🚀 emoji 👩‍💻 and ✓ ≤ ∑ €12,50 ٣٤٥ ½")


def python_source() -> str:
    """The source of a standard library module (some 12 KB): code, docstrings, indentation."""
    return inspect.getsource(json.decoder)


def zipf_words(n_words: int, seed: int) -> str:
    """Words drawn with Zipf's law frequencies, with punctuation, numbers and line breaks."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(WORDS))]
    pieces = []
    for i in range(n_words):
        pieces.append(rng.choices(WORDS, weights)[0])
        roll = rng.random()
        pieces.append(", " if roll < 0.1 else ".\n" if roll < 0.15 else f" {rng.randint(0, 2000)} " if roll < 0.18
                      else " ")
    return "".join(pieces)


def mixed_scripts(n_pieces: int, seed: int) -> str:
    rng = random.Random(seed)
    tokens = SCRIPTS.split(" ")
    return " ".join(rng.choice(tokens) for _ in range(n_pieces))


def tied(n_chars: int, seed: int) -> str:
    """Few letters, evenly drawn: many pairs share a count, so the tie rule decides most merges."""
    rng = random.Random(seed)
    return "".join(rng.choice("abc d\n") for _ in range(n_chars))


def runs() -> str:
    """Repeated letters, where pairs overlap ("aaa": minbpe merges the left two)."""
    return "aaaa aaa aaaaaaa bbbbbb aa a aaaaa abababab aaab baaa   \n\n\n  aaaaaaaaa" * 3


def random_unicode(n_chars: int, seed: int) -> str:
    """Code points from every plane's common ranges (no surrogates), for round trips."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x2FF), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0x97F),
              (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xF8FF), (0xFFF0, 0xFFFF),
              (0x1F300, 0x1F6FF), (0x20000, 0x2A6DF), (0xE0000, 0xE007F), (0x10FFF0, 0x10FFFF)]
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n_chars))
