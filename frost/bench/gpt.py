"""`frost bench gpt`: a GPT (frost.models.gpt) trained on a token corpus, timed step by step, with held-out loss.

Presets:
  shakespeare-char  nanoGPT's character model (6 layers, 6 heads, 384 wide, block 256, batch 64, dropout 0.2) on
                    tinyshakespeare: 5,000 steps, AdamW(betas=(0.9, 0.99), weight_decay=0.1), lr 1e-3 with 100
                    warm-up steps then cosine to 1e-4, gradients clipped to norm 1, evaluation every 250 steps.
                    The corpus is --data (any UTF-8 text file, one token per character); without it, the first
                    32 KB of tinyshakespeare shipped inside the package (a smoke run, not the protocol).
  gpt2-124m         GPT-2 small (12 layers, 12 heads, 768 wide, block 1024, vocabulary 50,304), batch 8, bf16,
                    AdamW(betas=(0.9, 0.95)), lr 6e-4 to 6e-5: throughput. --data is a token file (.npy, or raw
                    uint16 as nanoGPT's train.bin), or a text file encoded with --tokenizer (GPT-2's tiktoken rank
                    file, read by frost.text.BPE); without --data, uniformly random tokens (the loss then stays
                    near ln(50,257) = 10.8: only the speed means something).

Both: the first 90 % of the tokens train, the last 10 % are held out (nanoGPT's split). Each step draws batch_size
windows at random starts from a NumPy generator seeded by the seed, so the PyTorch twin
(benchmarks/torch_gpt.py, which runs this module's loop) trains on the same batches from the same initial
weights. The evaluation averages the loss (no dropout) over --eval-iters fixed batches of each split. The lr
warms up for min(the preset's warm-up, steps / 10) steps, then decays to the minimum at the last step.

Timing: each step is timed alone (the GPU synchronized before each clock read); ms/step is the median over the
steps after --warmup (which train too); tokens/s = batch x block / that median; MFU is nanoGPT's estimate
against the H100/H200 dense bf16 peak (cuda only). Start-up is the model build and the warm-up steps (jit's
capture included). On a CPU without --steps the run shrinks to a smoke run (said in its first lines).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

import frost
from frost.bench import common
from frost.bench.resnet_cifar10 import device_name, note, resolve_device, synchronizer
from frost.data.text import TokenDataset
from frost.nn.parallel import DistributedDataParallel
from frost.io import expand_path
from frost.jit import jit
from frost.models import GPT, GPTConfig
from frost.nn.utils import clip_grad_norm_
from frost.optim.lr_scheduler import warmup_cosine
from frost.tensor import Tensor

try:  # the text extra (numba, regex); only --tokenizer needs it
    from frost.text import BPE
except ImportError as _missing_text_extra:
    BPE, TEXT_EXTRA_ERROR = None, str(_missing_text_extra)

SAMPLE_FILE = Path(__file__).resolve().parent / "tinyshakespeare_sample.txt"
GPT2_VOCAB = 50257  # GPT-2's tokens; the model's table is padded to 50,304
GPT2_END_OF_TEXT = 50256
TRAIN_SHARE = 0.9
RANDOM_TOKENS = 1 << 20  # the random stream gpt2-124m trains on without --data
# a CPU run without --steps: sizes that finish in about a minute on a 2-core CPU (the preset's would take days)
CPU_SMOKE = {"steps": 30, "batch_size": 4, "block_size": 64, "eval_iters": 4}


@dataclass(frozen=True)
class TrainingProtocol:
    """What a preset fixes and a run settles (Preset and Settings): the model's sizes and the training's settings."""

    config: GPTConfig
    batch_size: int
    steps: int
    lr: float
    min_lr: float
    lr_warmup: int
    betas: tuple[float, float]
    weight_decay: float
    grad_clip: float
    eval_interval: int  # 0: only after the last step
    eval_iters: int
    precision: str
    target_loss: float | None  # the held-out loss whose first crossing is timed


@dataclass(frozen=True)
class Preset(TrainingProtocol):
    """A training protocol as published (the vocabulary comes from the data) and the kind of tokens it reads."""

    tokens: str  # "char": one token per character of a text; "bpe": GPT-2's tokens


PRESETS = {
    "shakespeare-char": Preset(GPTConfig.shakespeare_char(), tokens="char", batch_size=64, steps=5000, lr=1e-3,
                               min_lr=1e-4, lr_warmup=100, betas=(0.9, 0.99), weight_decay=0.1, grad_clip=1.0,
                               eval_interval=250, eval_iters=200, precision="fp32", target_loss=1.48),
    "gpt2-124m": Preset(GPTConfig.gpt2_124m(), tokens="bpe", batch_size=8, steps=100, lr=6e-4, min_lr=6e-5,
                        lr_warmup=2000, betas=(0.9, 0.95), weight_decay=0.1, grad_clip=1.0, eval_interval=0,
                        eval_iters=20, precision="bf16", target_loss=None),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default="shakespeare-char")
    p.add_argument("--data", type=Path, default=None,
                   help="shakespeare-char: a UTF-8 text file (default: the embedded 32 KB sample); gpt2-124m: a "
                        "token file (.npy or raw uint16 .bin), or a text file with --tokenizer (default: random "
                        "tokens)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="gpt2-124m with a text --data: GPT-2's tiktoken rank file (gpt2.tiktoken), read by "
                        "frost.text.BPE")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                   help="bf16: the forward under frost.autocast(frost.bfloat16) (default: the preset's)")
    p.add_argument("--jit", action="store_true", help="capture the training step with frost.jit (cuda only)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the preset's)")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing (they train)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches a step: the gradients of N batches of --batch-size windows accumulate (each "
                        "loss divided by N) before clipping and the update, inside one captured step with --jit "
                        "(nanoGPT's gradient_accumulation_steps)")
    p.add_argument("--block-size", type=int, default=None, help="context length (default: the preset's)")
    p.add_argument("--dropout", type=float, default=None, help="default: the preset's")
    p.add_argument("--eval-interval", type=int, default=None, help="steps between evaluations (0: at the end)")
    p.add_argument("--eval-iters", type=int, default=None, help="batches per split in an evaluation")
    p.add_argument("--seeds", type=common.parse_seeds, default=[0], help="comma-separated (default 0)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    p.add_argument("--log-every", type=int, default=None, help="loss-curve sample interval (default steps / 200)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--without", type=fast_path_names, default=[],
                   help="fast paths switched off (frost.dispatch op names, comma-separated, e.g. sum_in_dtypes): "
                        "what one is worth, measured beside a run with it")
    common.add_data_parallel_argument(p)


def fast_path_names(text: str) -> list[str]:
    """'sum_in_dtypes,add' -> the names, each one that the acceleration layer registers."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {path.op for path in frost.dispatch.registered()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"no fast path registers for {unknown}; known: {', '.join(sorted(known))}")
    return names


# ---------------------------------------------------------------- settings shared with the PyTorch twin


@dataclass(frozen=True)
class Settings(TrainingProtocol):
    """One run's protocol after the command line's overrides: what both frameworks train with."""

    preset: str
    warmup: int  # the first steps, left out of the timing
    log_every: int
    processes: int = 1  # data-parallel processes, each on batch_size windows of every global batch
    grad_accum: int = 1  # micro-batches of batch_size windows per process and step

    def global_tokens(self) -> int:
        """Tokens trained per step over all processes and micro-batches."""
        return self.batch_size * self.processes * self.grad_accum * self.config.block_size

    def lr_at(self, step: int) -> float:
        return warmup_cosine(step, self.lr_warmup, self.steps, self.lr, self.min_lr)

    def protocol(self) -> dict:
        """The settings as JSON, the model's sizes included."""
        out = {k: v for k, v in asdict(self).items() if k != "config"}
        out["model"] = asdict(self.config)
        return out


def settle(args: argparse.Namespace, device: str, vocab_size: int) -> Settings:
    """The preset with --batch-size, --block-size, --dropout, --steps and the evaluation options applied; a CPU run
    without --steps becomes the smoke run CPU_SMOKE (only where the command line left a size unset)."""
    preset = PRESETS[args.preset]
    given = {k: getattr(args, k) for k in ("steps", "batch_size", "block_size", "eval_iters")}
    if device == "cpu" and args.steps is None:
        given = {k: CPU_SMOKE[k] if v is None else v for k, v in given.items()}
        note(f"a CPU smoke run of {args.preset}: {given['steps']} steps of batch {given['batch_size']} x "
             f"{given['block_size']} tokens (the preset's sizes take days here; pass --steps to choose)")
    config = replace(preset.config, vocab_size=vocab_size, block_size=given["block_size"] or preset.config.block_size,
                     dropout=preset.config.dropout if args.dropout is None else args.dropout)
    steps = given["steps"] or preset.steps
    return Settings(
        preset=args.preset, config=config, batch_size=given["batch_size"] or preset.batch_size, steps=steps,
        warmup=min(args.warmup, steps - 1), lr=preset.lr, min_lr=preset.min_lr,
        lr_warmup=min(preset.lr_warmup, steps // 10), betas=preset.betas, weight_decay=preset.weight_decay,
        grad_clip=preset.grad_clip,
        eval_interval=preset.eval_interval if args.eval_interval is None else args.eval_interval,
        eval_iters=given["eval_iters"] or preset.eval_iters, precision=args.precision or preset.precision,
        target_loss=preset.target_loss, log_every=args.log_every or max(1, steps // 200),
        processes=common.processes(args), grad_accum=getattr(args, "grad_accum", 1))


def check_arguments(args: argparse.Namespace, device: str) -> None:
    """Refuse what cannot run, before the data is read or a model built."""
    for name in ("steps", "batch_size", "block_size", "eval_iters", "grad_accum"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"frost bench gpt: --{name.replace('_', '-')} must be at least 1, got {value}")
    if args.warmup < 0 or (args.eval_interval is not None and args.eval_interval < 0):
        raise SystemExit("frost bench gpt: --warmup and --eval-interval must be >= 0")
    if args.dropout is not None and not 0.0 <= args.dropout < 1.0:
        raise SystemExit(f"frost bench gpt: --dropout must be in [0, 1), got {args.dropout}")
    if args.jit and device != "cuda":
        raise SystemExit(f"frost bench gpt: --jit captures the step into a CUDA graph and needs --device cuda "
                         f"(this run is on {device})")
    if args.tokenizer is not None and args.preset != "gpt2-124m":
        raise SystemExit(f"frost bench gpt: --tokenizer is for --preset gpt2-124m; {args.preset} is character-level")
    common.check_output_path("--out", args.out)


# ---------------------------------------------------------------- data


@dataclass
class Corpus:
    """Token ids (int64) split into training and held-out parts, and where they came from."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    source: str


def load_corpus(preset: str, data: Path | None, tokenizer: Path | None, seed: int = 0) -> Corpus:
    """The preset's tokens: characters of a text (shakespeare-char), GPT-2 tokens from a file or a tokenizer, or
    random GPT-2 tokens (gpt2-124m without --data)."""
    if PRESETS[preset].tokens == "char":
        path = SAMPLE_FILE if data is None else existing(data)
        ids, vocab_size = char_tokens(read_text(path))
        return split(ids, vocab_size, "embedded sample" if data is None else str(data))
    if data is None:
        ids = np.random.default_rng(seed).integers(0, GPT2_VOCAB, size=RANDOM_TOKENS)
        return split(ids, PRESETS[preset].config.vocab_size, "random tokens")
    path = existing(data)
    ids = bpe_tokens(path, tokenizer) if tokenizer is not None else token_file(path)
    if ids.size and int(ids.max()) >= PRESETS[preset].config.vocab_size:
        raise SystemExit(f"frost bench gpt: --data {data} holds token id {int(ids.max())}, past GPT-2's vocabulary")
    return split(ids, PRESETS[preset].config.vocab_size, str(data))


def existing(path: Path) -> str:
    expanded = expand_path(path)
    if not Path(expanded).is_file():
        raise SystemExit(f"frost bench gpt: --data {path} is not a file")
    return expanded


def read_text(path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SystemExit(f"frost bench gpt: --data {path} is not UTF-8 text ({e})") from None


def char_tokens(text: str) -> tuple[np.ndarray, int]:
    """Each character's index among the text's distinct characters in code-point order (nanoGPT's stoi)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    chars, ids = np.unique(codes, return_inverse=True)
    return ids.astype(np.int64), len(chars)


def token_file(path: str) -> np.ndarray:
    """A token file: .npy (TokenDataset.encode_to_file's), else raw uint16 (nanoGPT's train.bin)."""
    if not path.endswith((".npy", ".bin")):
        raise SystemExit(f"frost bench gpt: --data {path}: gpt2-124m reads a token file (.npy or .bin); for a "
                         f"text file pass --tokenizer GPT-2's tiktoken rank file")
    return np.asarray(TokenDataset.from_file(path, block_size=1).tokens, dtype=np.int64)


def bpe_tokens(path: str, tokenizer: Path) -> np.ndarray:
    """The text at `path` in GPT-2's tokens, from GPT-2's tiktoken rank file."""
    if BPE is None:
        raise SystemExit(f"frost bench gpt: --tokenizer needs frost.text ({TEXT_EXTRA_ERROR})")
    ranks = expand_path(tokenizer)
    if not Path(ranks).is_file():
        raise SystemExit(f"frost bench gpt: --tokenizer {tokenizer} is not a file")
    bpe = BPE.from_tiktoken(ranks, pattern="gpt2", special_tokens={"<|endoftext|>": GPT2_END_OF_TEXT})
    return np.asarray(bpe.encode_ordinary(read_text(path)), dtype=np.int64)


def split(ids: np.ndarray, vocab_size: int, source: str) -> Corpus:
    n = int(TRAIN_SHARE * len(ids))
    return Corpus(ids[:n], ids[n:], vocab_size, source)


def check_corpus(corpus: Corpus, block_size: int) -> None:
    for name, part in (("training", corpus.train), ("held-out", corpus.val)):
        if len(part) < block_size + 1:
            raise SystemExit(f"frost bench gpt: the {name} split of {corpus.source} has {len(part)} tokens, fewer "
                             f"than block_size + 1 = {block_size + 1}; use more text or a smaller --block-size")


def draw_starts(rng: np.random.Generator, n_tokens: int, settings: Settings, micro_batches: int = 1) -> np.ndarray:
    """The global batch's random window starts (nanoGPT's get_batch: randint(len(data) - block_size)): micro-batch
    after micro-batch, each batch_size windows per process in rank order."""
    size = settings.batch_size * settings.processes * micro_batches
    return rng.integers(0, n_tokens - settings.config.block_size, size=size)


def my_micro_batches(starts: np.ndarray, settings: Settings, rank: int) -> np.ndarray:
    """This process's windows of a step's starts, one row (batch_size windows) per micro-batch."""
    return starts.reshape(settings.grad_accum, settings.processes, settings.batch_size)[:, rank]


def eval_starts(corpus: Corpus, settings: Settings, seed: int) -> dict[str, list[np.ndarray]]:
    """The fixed evaluation batches of each split (the same ones at every evaluation and in both frameworks)."""
    rng = np.random.default_rng([seed, 1])
    return {split: [draw_starts(rng, len(tokens), settings) for _ in range(settings.eval_iters)]
            for split, tokens in (("train", corpus.train), ("val", corpus.val))}


# ---------------------------------------------------------------- the loop both frameworks run


class Trainer(Protocol):
    """What a framework supplies to train_run: a step on the windows at `starts`, the lr, the evaluation."""

    def set_lr(self, lr: float) -> None: ...

    def step(self, starts: np.ndarray): ...  # returns the loss as a 0-d tensor (.item() reads it)

    def eval_loss(self, split: str, starts: list[np.ndarray]) -> float: ...

    def estimate_mfu(self, batch_size: int, seconds: float) -> float: ...


def train_run(trainer: Trainer, corpus: Corpus, settings: Settings, seed: int, synchronize: Callable | None,
              t_start: float, quiet: bool = False, with_mfu: bool = False) -> dict:
    """`settings.steps` steps on batches drawn from `seed`, evaluations on the way; the run's record.

    t_start is when the run began (before the model was built): start-up and the evaluations' wall times count
    from it."""
    sw = common.Stopwatch(synchronize)
    rng = np.random.default_rng(seed)
    evals = eval_starts(corpus, settings, seed)
    curve, eval_curve, step_s = [], [], []
    bar = common.progress_bar(settings.steps, f"seed {seed}", disable=quiet)
    t_timed = None
    for i in range(settings.steps):
        if i == settings.warmup:
            t_timed = sw.now()
        trainer.set_lr(settings.lr_at(i))
        starts = draw_starts(rng, len(corpus.train), settings, settings.grad_accum)
        t0 = sw.now()
        with common.step_range(timed=i >= settings.warmup):
            loss = trainer.step(starts)
        step_s.append(sw.now() - t0)
        if i == 0 or (i + 1) % settings.log_every == 0 or i == settings.steps - 1:
            curve.append([i + 1, float(loss.item())])
            tokens_s = settings.global_tokens() / statistics.median(step_s)
            common.advance(bar, i + 1, loss=f"{curve[-1][1]:.4f}", tok_s=f"{tokens_s:,.0f}")
        if is_eval_step(i, settings):
            eval_curve.append(evaluate(trainer, evals, i + 1, sw.now() - t_start))
    bar.close()
    return run_record(seed, settings, step_s, curve, eval_curve, t_timed - t_start, trainer, with_mfu)


def is_eval_step(i: int, settings: Settings) -> bool:
    last = i == settings.steps - 1
    return last or (settings.eval_interval > 0 and (i + 1) % settings.eval_interval == 0)


def evaluate(trainer: Trainer, evals: dict[str, list[np.ndarray]], step: int, wall_s: float) -> list[float]:
    """[step, train loss, held-out loss, seconds since the start] (the seconds before this evaluation)."""
    return [step, trainer.eval_loss("train", evals["train"]), trainer.eval_loss("val", evals["val"]), wall_s]


def run_record(seed: int, settings: Settings, step_s: list[float], curve: list, eval_curve: list, startup_s: float,
               trainer: Trainer, with_mfu: bool) -> dict:
    timed = step_s[settings.warmup:]
    median = statistics.median(timed)
    best = min(eval_curve, key=lambda e: e[2])
    reached = [e[3] for e in eval_curve if settings.target_loss is not None and e[2] <= settings.target_loss]
    return {
        "seed": seed, "steps_timed": len(timed), "warmup_steps": settings.warmup,
        "ms_per_step": 1000 * median, "ms_per_step_mean": 1000 * statistics.fmean(timed),
        "tokens_per_s": settings.global_tokens() / median,
        "mfu": trainer.estimate_mfu(settings.batch_size * settings.grad_accum, median) if with_mfu else None,
        "train_time_s": sum(timed), "startup_s": startup_s,
        "first_loss": curve[0][1], "final_loss": curve[-1][1],
        "train_loss": eval_curve[-1][1], "val_loss": eval_curve[-1][2],
        "best_val_loss": best[2], "best_val_step": best[0],
        "time_to_target_s": reached[0] if reached else None,
        "loss_every": settings.log_every, "loss_curve": curve, "eval_curve": eval_curve,
    }


SUMMARY_KEYS = ("ms_per_step", "tokens_per_s", "mfu", "final_loss", "val_loss", "best_val_loss", "time_to_target_s",
                "startup_s")


def summarize(runs: list[dict]) -> dict:
    """{key: {"mean", "std", "n"}} over the seeds' runs, for the keys a GPT run reports."""
    out = {}
    for key in SUMMARY_KEYS:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            mean, std = common.mean_std(values)
            out[key] = {"mean": mean, "std": std, "n": len(values)}
    return out


# ---------------------------------------------------------------- results


def new_gpt_result(framework: str, mode: str, settings: Settings, device: str, name: str, seeds: list[int],
                   corpus: Corpus, extra_versions: dict | None = None) -> dict:
    """common.new_result's skeleton with this benchmark's name, protocol and data."""
    result = common.new_result(framework, mode, settings.precision, device, name, settings.steps, seeds,
                               extra_versions)
    result.update({"benchmark": "gpt", "preset": settings.preset, "protocol": settings.protocol(),
                   "data": corpus.source, "n_train_tokens": int(len(corpus.train)),
                   "n_val_tokens": int(len(corpus.val)), "vocab_size": corpus.vocab_size})
    return result


def results_table(result: dict) -> str:
    """Per seed: ms/step (median), tokens/s, MFU, last training loss, held-out loss, best held-out loss."""
    def cell(value, fmt: str) -> str:
        return "-" if value is None else f"{value:{fmt}}"

    columns = [("ms_per_step", ".2f"), ("tokens_per_s", ",.0f"), ("mfu", ".1%"), ("final_loss", ".4f"),
               ("val_loss", ".4f"), ("best_val_loss", ".4f"), ("time_to_target_s", ".1f"), ("startup_s", ".1f")]
    header = ["seed", "ms/step", "tokens/s", "MFU", "loss", "val loss", "best val", "s to target", "start-up s"]
    rows = [[str(r["seed"])] + [cell(r.get(k), fmt) for k, fmt in columns] for r in result["runs"]]
    p = result["protocol"]
    title = (f"{result['framework']} {result['mode']} {result['precision']} on {result['device_name']}: gpt "
             f"{result['preset']} ({p['steps']} steps, batch {p['batch_size']} x {p['model']['block_size']}, "
             f"{result['data']})")
    return title + "\n" + common.format_table(rows, header)


# ---------------------------------------------------------------- Frost


def build_model(config: GPTConfig, seed: int) -> GPT:
    """The GPT a run of `seed` starts from (on the CPU): the PyTorch twin copies these weights."""
    frost.manual_seed(seed)
    return GPT(config)


class FrostTrainer:
    """The GPT, its AdamW and the step (gather the windows on the device, forward, backward, clip, AdamW)."""

    def __init__(self, corpus: Corpus, settings: Settings, seed: int, device: str, use_jit: bool) -> None:
        self.settings, self.device = settings, device
        self.model = build_model(settings.config, seed).to(device)
        self.opt = self.model.configure_optimizers(settings.weight_decay, settings.lr, settings.betas)
        self.rank, _ = common.data_parallel_rank()
        self.net = DistributedDataParallel(self.model) if common.is_data_parallel() else self.model
        self.tokens = {"train": frost.tensor(corpus.train, device=device).data,
                       "val": frost.tensor(corpus.val, device=device).data}
        self.offsets = frost.arange(settings.config.block_size + 1, device=device).data
        self.train_step = jit(self._step) if use_jit else self._step
        # evaluations are most of a protocol run's forward passes (2 x 200 batches every 250 steps): captured too
        self.eval_batch = jit(self._eval_batch) if use_jit else self._eval_batch

    def autocast(self):
        return frost.autocast(frost.bfloat16) if self.settings.precision == "bf16" else contextlib.nullcontext()

    def batch(self, split: str, starts: Tensor) -> tuple[Tensor, Tensor]:
        windows = self.tokens[split][starts.data[:, None] + self.offsets]
        xp = starts.xp
        return Tensor(xp.ascontiguousarray(windows[:, :-1])), Tensor(xp.ascontiguousarray(windows[:, 1:]))

    def _step(self, micro_starts: Tensor) -> Tensor:
        """One update from the micro-batches' windows (grad_accum rows of batch_size starts); the mean loss."""
        self.opt.zero_grad()
        n = self.settings.grad_accum
        losses = []
        for m in range(n):
            x, y = self.batch("train", Tensor(micro_starts.data[m]))
            # DDP averages over processes once, after the last micro-batch
            with self._no_sync() if m < n - 1 else contextlib.nullcontext():
                with self.autocast():
                    _, loss = self.net(x, y)
                (loss / n if n > 1 else loss).backward()
            losses.append(loss.detach())
        clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.opt.step()
        return losses[0] if n == 1 else sum(losses[1:], losses[0]) / n

    def _no_sync(self):
        return self.net.no_sync() if isinstance(self.net, DistributedDataParallel) else contextlib.nullcontext()

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def step(self, starts: np.ndarray) -> Tensor:
        """One step on this process's windows of the global batch's `starts`."""
        mine = my_micro_batches(starts, self.settings, self.rank)
        return self.train_step(frost.tensor(mine, device=self.device))

    def _eval_batch(self, split: str, starts: Tensor) -> Tensor:
        """The loss of the windows of `split` at `starts`, without gradients (eval_loss sets eval mode)."""
        with frost.no_grad(), self.autocast():
            return self.model(*self.batch(split, starts))[1]

    def eval_loss(self, split: str, starts: list[np.ndarray]) -> float:
        self.model.eval()
        total = 0.0
        for s in starts:
            total += float(self.eval_batch(split, frost.tensor(s, device=self.device)).item())
        self.model.train()
        return total / len(starts)

    def estimate_mfu(self, batch_size: int, seconds: float) -> float:
        return self.model.estimate_mfu(batch_size, seconds)


def run(args: argparse.Namespace) -> dict:
    """Train every seed; print the table; write JSON when --out is given. Returns the result."""
    common.check_data_parallel_arguments(args)
    if args.nproc_per_node is not None:
        return common.run_data_parallel(args, run_here)
    return run_here(args)


def run_here(args: argparse.Namespace, report: bool = True, data_ready: Callable[[], None] = lambda: None) -> dict:
    """The benchmark in this process (one rank of several with --nproc-per-node)."""
    device = resolve_device(args.device)
    check_arguments(args, device)
    t0 = time.perf_counter()
    corpus = load_corpus(args.preset, args.data, args.tokenizer)
    data_ready()
    data_load_s = time.perf_counter() - t0
    settings = settle(args, device, corpus.vocab_size)
    check_corpus(corpus, settings.config.block_size)
    note(f"data: {corpus.source} ({len(corpus.train):,} training / {len(corpus.val):,} held-out tokens, vocabulary "
         f"{corpus.vocab_size:,})")
    mode = "jit" if args.jit else "eager"
    result = new_gpt_result("frost", mode, settings, device, device_name(device), args.seeds, corpus)
    result.update({"jit": args.jit, "data_load_s": data_load_s, "without": args.without})
    with frost.dispatch.disabled(*args.without):
        for seed in args.seeds:
            t_start = time.perf_counter()
            trainer = FrostTrainer(corpus, settings, seed, device, args.jit)
            result["params"] = trainer.model.num_params()
            result["runs"].append(train_run(trainer, corpus, settings, seed, synchronizer(device), t_start,
                                            args.quiet, with_mfu=device == "cuda"))
            result["summary"] = summarize(result["runs"])
            if args.out:
                common.write_json(args.out, result)  # partial results survive an interrupted run
    if report:
        print(results_table(result))
    if args.out:
        print(f"results written to {args.out}")
    return result
