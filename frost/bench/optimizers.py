"""`frost bench optimizers`: the seed ResNet on CIFAR-10 trained with each optimizer of the zoo, over seeds.

Everything but the optimizer is the seed benchmark's protocol (see `frost bench resnet-cifar10`): images scaled
to [0, 1], batch 32 reshuffled each epoch, the dataset resident on the device, the step captured by frost.jit
on cuda, a constant learning rate (no schedule), one parameter group (Muon excepted: the output layer goes to its
internal AdamW, as its reference advises). Each optimizer uses the learning rate of the table RECIPES below (its
paper's default, or a stated choice, printed with the results); `--lr name=value` overrides one (for Muon, the
Muon lr; its AdamW keeps 3e-4). SophiaG also runs its Hessian-refresh step (a second captured function) every
k = 10 steps.

Every `--eval-every` steps the test accuracy over all 10,000 test images is measured (outside the train time),
which gives the accuracy curve and the steps needed to reach `--target` (60%). A run whose loss becomes NaN or
infinite, or exceeds 10x its first value, is stopped and reported with the step where that happened; the other
runs go on. The table also counts the lines of each optimizer's file in frost/optim/: the point is how little
code each one needs.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NoReturn

import numpy as np

import frost.nn.functional as F
from frost.optim.sophia import sample_labels
from frost.tensor import Tensor
from frost.bench import common
from frost.bench.resnet_cifar10 import (add_data_arguments, add_memory_format_argument, build_model, check_sizes,
                                        evaluate, float_logits, jit_wrapper, load_into, make_step, new_frost_result,
                                        on_resident_data, prepare, resident_batches, synchronizer, training_step)

SCHEMA = "frost-bench-optimizers/1"
OPTIM_DIR = Path(__file__).resolve().parents[1] / "optim"
DIVERGENCE_FACTOR = 10.0  # a loss above this multiple of the first step's loss counts as diverged
# steps between the checks for NaN/inf/divergence: on cuda each check is a host read-back (a sync), so the losses
# are gathered on the device and read 50 at a time; on the CPU reading is free, and checking each step stops a
# diverged run at once (NumPy crawls through inf and NaN).
LOSS_CHECK_EVERY = {"cuda": 50, "cpu": 1}


@dataclass(frozen=True)
class Recipe:
    """How the benchmark builds one optimizer: its class in frost.optim, its file, its lr and why that lr."""

    name: str
    cls: str
    module: str  # frost/optim/<module>.py
    lr: float
    why: str
    kwargs: dict = field(default_factory=dict)  # hyper-parameters other than lr (class defaults otherwise)
    hessian_every: int = 0  # SophiaG: refresh the diagonal Hessian estimate every k steps
    param_groups: Callable | None = None  # model -> the optimizer's param groups (default: one group of all)


def muon_param_groups(model) -> list[dict]:
    """The Muon reference's advice: Muon for the hidden layers, its internal AdamW for the output layer (fc)."""
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if not n.startswith("fc.")]},
            {"params": [p for n, p in named if n.startswith("fc.")], "use_muon": False}]


RECIPES = (
    # He et al. 2016 (CIFAR-10 ResNets): lr 0.1 at batch 128, momentum 0.9, weight decay 1e-4, then step decays.
    Recipe("sgd", "SGD", "sgd", 0.025, "He et al. 2016's CIFAR-10 ResNet lr 0.1 at batch 128, scaled linearly to "
           "batch 32 (its first phase: no decay here); momentum 0.9 (Nesterov), L2 weight decay 1e-4 as there",
           dict(momentum=0.9, nesterov=True, weight_decay=1e-4)),
    Recipe("adamw", "AdamW", "adamw", common.PROTOCOL["lr"], "the seed benchmark's AdamW settings",
           dict(betas=tuple(common.PROTOCOL["betas"]), eps=common.PROTOCOL["eps"],
                weight_decay=common.PROTOCOL["weight_decay"])),
    # The Lion paper: lr 3-10x smaller than AdamW's, weight decay 3-10x larger so lr * wd stays the same.
    # The seed's AdamW lr (1e-4) is already small for batch 32, so the low end of the range: a factor 3.
    Recipe("lion", "Lion", "lion", common.PROTOCOL["lr"] / 3, "the paper's advice: AdamW's lr / 3 (the low "
           "end of 3-10x, AdamW's 1e-4 being small already), weight decay x3 = 0.03 (same lr * wd)",
           dict(betas=(0.9, 0.99), weight_decay=3 * common.PROTOCOL["weight_decay"])),
    Recipe("muon", "Muon", "muon", 0.02, "the reference implementation's defaults: lr 0.02, momentum 0.95, "
           "Nesterov, 5 Newton-Schulz steps on the conv filters; its internal AdamW (lr 3e-4, betas (0.9, 0.95)) "
           "for BatchNorm gains, biases and the output layer, as the reference advises",
           param_groups=muon_param_groups),
    # SophiaG's bs is the number of labels behind one loss (the reference's tokens per batch): 32 images here.
    Recipe("sophiag", "SophiaG", "sophia", 1e-4, "the reference SophiaG defaults (lr 1e-4, betas (0.965, 0.99), "
           "rho 0.04, weight decay 0.1) with bs = 32 labels per batch; Hessian estimate refreshed every k = 10 "
           "steps as in the paper", dict(bs=common.PROTOCOL["batch_size"], k=10), hessian_every=10),
    Recipe("adafactor", "Adafactor", "adafactor", 1e-2, "the paper's relative step min(1e-2, 1/sqrt(t)) scaled "
           "by RMS(parameter), no first moment (lr is the cap 1e-2)"),
    Recipe("lamb", "LAMB", "lamb", 1e-3, "the common default 1e-3 (the paper tunes lr with warm-up and decay "
           "for large batches; no schedule here), betas (0.9, 0.999), eps 1e-6, weight decay 0.01"),
)
BY_NAME = {r.name: r for r in RECIPES}


# ---------------------------------------------------------------- arguments


def parse_names(text: str) -> list[str]:
    """'adamw,lion' -> ['adamw', 'lion'], each a name of RECIPES."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown optimizer(s) {unknown or text!r}; choose from "
                                         f"{', '.join(BY_NAME)}")
    return names


def parse_lr(text: str) -> tuple[str, float]:
    """'lion=3e-5' -> ('lion', 3e-05)."""
    name, sep, value = text.partition("=")
    try:
        lr = float(value)
    except ValueError:
        lr = None
    if not sep or name.strip().lower() not in BY_NAME or lr is None or not lr >= 0:
        raise argparse.ArgumentTypeError(f"expected NAME=LR with NAME one of {', '.join(BY_NAME)}, got {text!r}")
    return name.strip().lower(), lr


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    p.add_argument("--optimizers", type=parse_names, default=list(BY_NAME),
                   help=f"comma-separated (default all: {','.join(BY_NAME)})")
    p.add_argument("--lr", type=parse_lr, action="append", default=[], metavar="NAME=LR",
                   help="override one optimizer's learning rate (repeatable), e.g. --lr lion=3e-5")
    p.add_argument("--eval-every", type=int, default=500, help="steps between test-accuracy evaluations")
    p.add_argument("--target", type=float, default=0.6, help="test accuracy for 'steps to reach' (default 0.6)")
    p.add_argument("--jit", choices=["on", "off"], default="on",
                   help="capture the steps into CUDA graphs with frost.jit (cuda only; default on)")
    add_memory_format_argument(p)
    p.add_argument("--eval-batch", type=int, default=500, help="batch size for the test-set evaluation")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write the test accuracy against steps as a PNG here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                   help="train nothing: join result files of the same protocol (e.g. optimizers run in separate "
                        "calls), then print, --out and --plot as usual")


# ---------------------------------------------------------------- the optimizers


def optimizer_class(recipe: Recipe):
    """The class frost.optim.<cls> (or frost.optim.<module>.<cls>); LookupError saying why when unavailable."""
    try:
        optim = importlib.import_module("frost.optim")
        cls = getattr(optim, recipe.cls, None)
        if cls is None:
            cls = getattr(importlib.import_module(f"frost.optim.{recipe.module}"), recipe.cls)
    except ModuleNotFoundError as e:
        raise LookupError(f"frost.optim.{recipe.cls} not found ({e})") from None
    except Exception as e:  # a file mid-edit must not stop the other optimizers
        raise LookupError(f"frost.optim.{recipe.cls} failed to import: {type(e).__name__}: {e}") from None
    return cls


def line_counts(path: Path) -> dict:
    """Lines of a Python file: total, code (non-blank, non-comment) and logic (code without docstrings)."""
    text = path.read_text()
    lines = text.splitlines()
    code = {i for i, line in enumerate(lines, 1) if line.strip() and not line.strip().startswith("#")}
    try:
        docstrings = _docstring_lines(ast.parse(text))
    except SyntaxError:  # a file mid-edit: no logic count
        return {"loc_total": len(lines), "loc_code": len(code), "loc_logic": None}
    return {"loc_total": len(lines), "loc_code": len(code), "loc_logic": len(code - docstrings)}


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def hyperparameters(opt) -> list[dict]:
    """Each param group's settings and parameter count, JSON-friendly."""
    return [{"n_params": len(group["params"]),
             **{k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()
                if k != "params" and isinstance(v, (int, float, str, bool, tuple, type(None)))}}
            for group in opt.param_groups]


def sophia_refresh_step(model, opt, precision: str):
    """train(x, y), then SophiaG's Hessian estimate on the same batch: the loss on labels sampled from the
    model's own predictions, its backward, opt.update_hessian(). One function, so frost.jit captures it whole."""
    train = training_step(model, opt, precision)

    def train_and_refresh(x, y):
        loss = train(x, y)
        logits = float_logits(model, x, precision)
        sampled_loss = F.cross_entropy(logits, sample_labels(logits))
        opt.zero_grad()
        sampled_loss.backward()
        opt.update_hessian()
        return loss

    return train_and_refresh


# ---------------------------------------------------------------- one run


class LossWatch:
    """Keeps each step's loss on the device and reads them back in windows, to find the first bad step."""

    def __init__(self) -> None:
        self.window: list = []
        self.first_step = 1
        self.initial: float | None = None
        self.curve: list[list[float]] = []  # [last step of the window, mean loss over the window]

    def add(self, loss) -> None:
        self.window.append(loss.data.copy())  # a copy: a jitted step returns the same buffer each call

    def check(self) -> dict | None:
        """Read the window back; the first NaN/inf/diverged step as {step, kind, loss}, or None."""
        if not self.window:
            return None
        xp = Tensor(self.window[0]).xp
        values = np.asarray(Tensor(xp.stack(self.window)).numpy(), dtype=np.float64).reshape(-1)
        steps = range(self.first_step, self.first_step + len(values))
        self.first_step += len(values)
        self.window = []
        if self.initial is None:
            self.initial = float(values[0])
        for step, value in zip(steps, values):
            kind = ("nan" if math.isnan(value) else "inf" if math.isinf(value)
                    else "divergence" if value > DIVERGENCE_FACTOR * self.initial else None)
            if kind:
                return {"step": step, "kind": kind, "loss": float(value) if kind == "divergence" else str(value),
                        "initial_loss": self.initial if math.isfinite(self.initial) else str(self.initial)}
        self.curve.append([steps[-1], float(values.mean())])
        return None


def step_functions(recipe: Recipe, model, opt, data: dict, jit) -> list:
    """[the training step] or, with a Hessian refresh, [the step, the step + refresh]: each a function of batch
    indices into the resident data, captured by frost.jit as its own graph when jit is given."""
    resident = data["x_train"], data["y_train"], data["x_train_nhwc"]
    steps = [make_step(model, opt, "fp32", jit, *resident)]
    if recipe.hessian_every:
        refresh = on_resident_data(sophia_refresh_step(model, opt, "fp32"), *resident)
        steps.append(jit(refresh) if jit is not None else refresh)
    return steps


def train_one_seed(args, recipe: Recipe, cls, lr: float, seed: int, data: dict, device: str) -> dict:
    """Train one optimizer from one seed, evaluating every --eval-every steps; stops early on divergence."""
    sw = common.Stopwatch(synchronizer(device))
    jit = jit_wrapper(args.jit == "on", device)
    model = build_model(seed, device, args.memory_format == "channels_last")
    opt = cls(recipe.param_groups(model) if recipe.param_groups else model.parameters(), lr=lr, **recipe.kwargs)
    steps = step_functions(recipe, model, opt, data, jit)
    batches = resident_batches(len(data["x_train"]), common.PROTOCOL["batch_size"], device)
    watch, accuracy, failure = LossWatch(), [], None
    bar = common.progress_bar(args.steps, f"{recipe.name} seed {seed}", disable=args.quiet)
    check_every = LOSS_CHECK_EVERY[device]
    # the first steps build gradients, optimizer state and cuDNN plans and capture the graphs: start-up, not training
    warmup = (3 + (1 if recipe.hessian_every else 0)) if jit is not None else 1
    train_s, startup_s, t0 = 0.0, 0.0, sw.now()
    for i in range(1, args.steps + 1):
        try:
            refresh_now = recipe.hessian_every and i % recipe.hessian_every == 0
            watch.add(steps[1 if refresh_now else 0](*next(batches)))
            evaluate_now = i % args.eval_every == 0 or i == args.steps
            if not (evaluate_now or i % check_every == 0 or i == warmup):
                continue
            failure = watch.check()
        except Exception as e:  # one broken optimizer must not stop the others
            failure = {"step": i, "kind": "error", "loss": None, "message": f"{type(e).__name__}: {e}"}
        if i <= warmup:
            startup_s += sw.now() - t0
        else:
            train_s += sw.now() - t0
        if failure:
            common.advance(bar, i)
            break
        if evaluate_now:
            accuracy.append([i, evaluate(model, data["x_test"], data["y_test"], args.eval_batch, "fp32")[0]])
            common.advance(bar, i, loss=f"{watch.curve[-1][1]:.4f}", acc=f"{100 * accuracy[-1][1]:.2f}%")
        else:
            common.advance(bar, i)
        t0 = sw.now()
    bar.close()
    steps_done = i
    reached = next((s for s, acc in accuracy if acc >= args.target), None)
    return {"seed": seed, "final_acc": accuracy[-1][1] if not failure and accuracy else None,
            "steps_to_target": reached, "failure": failure, "steps_done": steps_done, "train_time_s": train_s,
            "ms_per_step": 1000 * train_s / (steps_done - warmup) if steps_done > warmup else None,
            "startup_s": startup_s, "accuracy_curve": accuracy,
            "loss_curve": watch.curve, "hyperparameters": hyperparameters(opt), "jit": jit is not None}


# ---------------------------------------------------------------- summary, table, plot


def summarize(runs: list[dict]) -> dict:
    """Final accuracy over the runs that finished, steps to target over those that reached it, failures."""
    finished = [r["final_acc"] for r in runs if r["final_acc"] is not None]
    reached = [r["steps_to_target"] for r in runs if r["steps_to_target"] is not None]
    out = {"runs": len(runs), "finished": len(finished), "reached_target": len(reached),
           "failures": [dict(r["failure"], seed=r["seed"]) for r in runs if r["failure"]]}
    for key, values in (("final_acc", finished), ("steps_to_target", reached),
                        ("train_time_s", [r["train_time_s"] for r in runs]),
                        ("ms_per_step", [r["ms_per_step"] for r in runs if r["ms_per_step"] is not None])):
        if values:
            m, s = common.mean_std(values)
            out[key] = {"mean": m, "std": s, "n": len(values)}
    return out


def _row(name: str, entry: dict) -> list[str]:
    if not entry["available"]:
        return [name, "-", "not available", "-", "-", "-", "-", "-"]
    s = entry["summary"]
    acc = (f"{100 * s['final_acc']['mean']:.2f} +- {100 * s['final_acc']['std']:.2f}" if "final_acc" in s else "-")
    if s["finished"] < s["runs"]:
        acc += f" ({s['finished']}/{s['runs']} finished)"
    reach = (f"{s['steps_to_target']['mean']:.0f}" if "steps_to_target" in s else "-") + \
        f" ({s['reached_target']}/{s['runs']})"
    failures = "; ".join(f"seed {f['seed']}: {f['kind']} at step {f['step']}" for f in s["failures"]) or "none"
    loc = (f"{entry['loc_logic']} / {entry['loc_code']} / {entry['loc_total']}"
           if entry.get("loc_logic") is not None else "-")
    return [name, f"{entry['lr']:.3g}", acc, reach, failures, f"{s['train_time_s']['mean']:.1f}",
            f"{s['ms_per_step']['mean']:.2f}" if "ms_per_step" in s else "-", loc]


def _memory_format_note(result: dict) -> str:
    fmt = result["protocol"].get("memory_format")  # absent from files written before --memory-format
    return f", {fmt.replace('_', '-')}" if fmt else ""


def results_table(result: dict) -> str:
    """One row per optimizer, then the reasons for each learning rate."""
    target = result["protocol"]["target"]
    header = ["optimizer", "lr", "final test acc %", f"steps to {100 * target:.0f}% (reached)",
              "NaN/inf/divergence", "train s", "ms/step", "lines logic/code/all"]
    rows = [_row(name, entry) for name, entry in result["optimizers"].items()]
    title = (f"frost optimizers on {result['device_name']} ({result['protocol']['steps']} steps, batch "
             f"{result['protocol']['batch_size']}, seeds {','.join(map(str, result['seeds']))}, "
             f"{'jit' if result['jit'] else 'eager'}{_memory_format_note(result)})")
    notes = []
    for name, entry in result["optimizers"].items():
        if entry["available"]:
            notes.append(f"  {name}: lr {entry['lr']:.3g} - {entry['why']}")
        else:
            notes.append(f"  {name}: not available - {entry['reason']}")
    footer = (f"final test accuracy over the {result['n_test']:,} test images, mean +- std over the seeds that "
              f"finished; lines of frost/optim/<file>.py: logic (code without docstrings), code (non-blank, "
              f"non-comment), all\nlearning rates:\n")
    return title + "\n" + common.format_table(rows, header) + "\n" + footer + "\n".join(notes)


def write_plot(path: Path, result: dict) -> bool:
    """Test accuracy against steps, the mean over seeds with the min-max band; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, entry in result["optimizers"].items():
        curves = [dict(map(tuple, r["accuracy_curve"])) for r in entry.get("runs", [])]
        steps = sorted({s for c in curves for s in c})
        if not steps:
            continue
        per_step = [[100 * c[s] for c in curves if s in c] for s in steps]
        failed = len(entry["summary"]["failures"])
        label = f"{name} (lr {entry['lr']:.3g}" + (f", {failed}/{len(curves)} stopped early)" if failed else ")")
        line, = ax.plot(steps, [np.mean(v) for v in per_step], label=label)
        ax.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], alpha=0.2,
                        color=line.get_color())
    ax.axhline(100 * result["protocol"]["target"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"test accuracy % ({result['n_test']:,} test images)")
    ax.set_title(f"Seed ResNet on CIFAR-10, batch 32: optimizers ({len(result['seeds'])} seeds, min-max band)")
    ax.grid(alpha=0.3)
    ax.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


# ---------------------------------------------------------------- the command


# What the merge, the table and the plot read from a result file: a dict of keys (a trailing '?' marks one that
# may be absent), [spec] for a list of such items, else the type(s) the value must have.
NUMBER = (int, float)
STAT = {"mean": NUMBER, "std": NUMBER}
RESULT_SPEC = {"protocol": {"steps": int, "batch_size": int, "target": NUMBER}, "seeds": [int], "optimizers": dict,
               "device": str, "device_name": str, "jit": bool, "n_train": int, "n_test": int}
ENTRY_SPEC = {"lr": NUMBER, "why": str, "runs": [{"accuracy_curve": list}],
              "summary": {"runs": int, "finished": int, "reached_target": int, "train_time_s": STAT,
                          "failures": [{"seed": int, "kind": str, "step": int}],
                          "final_acc?": STAT, "steps_to_target?": STAT, "ms_per_step?": STAT}}
# the fields the table's title and footer print once for all rows: merged files must agree on each
MERGE_COMMON = ("protocol", "seeds", "device", "device_name", "jit", "n_train", "n_test")


def merge_results(paths: list[Path]) -> dict:
    """One result from several files of the same protocol, seeds, device and data: their optimizers side by side,
    each with the commit it ran at (the merged 'commit' lists them) and 'command' the merge's own."""
    results = [read_result(path) for path in paths]
    merged = dict(results[0], optimizers={})
    for path, result in zip(paths, results):
        refuse_difference(path, result, paths[0], results[0])
        # a later file's optimizer replaces an earlier one's; each keeps the commit it ran at
        merged["optimizers"].update({name: {**entry, "commit": entry.get("commit", result.get("commit"))}
                                     for name, entry in result["optimizers"].items()})
    commits = dict.fromkeys(entry["commit"] for entry in merged["optimizers"].values())
    merged.update(commit=", ".join(map(str, commits)), command=common.command_line(),
                  merged_from=[Path(path).name for path in paths])
    return merged


def read_result(path: Path) -> dict:
    """A result file for --merge, checked for everything the merge, the table and the plot read from it."""
    try:
        result = json.loads(Path(path).read_text())
    except OSError as e:
        refuse(path, f"cannot read it: {e.strerror or e}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        refuse(path, f"not JSON: {e}")
    if not isinstance(result, dict):
        refuse(path, f"JSON {type(result).__name__}, not an object")
    if result.get("schema") != SCHEMA:
        refuse(path, f"its schema is {result.get('schema')!r}")
    check_spec(path, result, RESULT_SPEC, "")
    for name, entry in result["optimizers"].items():
        check_entry(path, f"optimizers.{name}", entry)
    return result


def check_entry(path: Path, where: str, entry) -> None:
    """An optimizer's entry: a reason when it was not available; lr, why, runs and their summary when it was."""
    check_spec(path, entry, {"available": bool}, where)
    check_spec(path, entry, ENTRY_SPEC if entry["available"] else {"reason": str}, where)


def check_spec(path: Path, value, spec, where: str) -> None:
    """Refuse the file unless `value` (found at `where` in it) has the shape `spec` describes (see RESULT_SPEC)."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            refuse(path, f"{where or 'the file'} is a {type(value).__name__}, not an object")
        for key, item_spec in spec.items():
            name = key.rstrip("?")
            inner = f"{where}.{name}" if where else name
            if name in value:
                check_spec(path, value[name], item_spec, inner)
            elif not key.endswith("?"):
                refuse(path, f"no {inner}")
    elif isinstance(spec, list):
        if not isinstance(value, list):
            refuse(path, f"{where} is a {type(value).__name__}, not a list")
        for i, item in enumerate(value):
            check_spec(path, item, spec[0], f"{where}[{i}]")
    elif not isinstance(value, spec):
        refuse(path, f"{where} is a {type(value).__name__}")


def refuse(path: Path, why: str) -> NoReturn:
    raise SystemExit(f"frost bench optimizers --merge: {path} is not a {SCHEMA} result ({why})")


def refuse_difference(path: Path, result: dict, first_path: Path, first: dict) -> None:
    """Refuse a file whose protocol, seeds, device or data differ from the first file's: the table prints the first
    file's once, as if they held for every row."""
    for key in MERGE_COMMON:
        if result[key] != first[key]:
            field, theirs, ours = _first_difference(key, result[key], first[key])
            raise SystemExit(f"frost bench optimizers --merge: {path} is not a {SCHEMA} result with the protocol, "
                             f"seeds, device and data of {first_path}: its {field} is {theirs!r}, not {ours!r}; "
                             f"merge only results run the same way on the same device and data")


def _first_difference(key: str, theirs, ours) -> tuple[str, object, object]:
    """The field that differs, as 'protocol.steps' for a protocol entry, with both values."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        for k in sorted(set(theirs) | set(ours), key=str):
            if theirs.get(k) != ours.get(k):
                return f"{key}.{k}", theirs.get(k), ours.get(k)
    return key, theirs, ours


def report(result: dict, args: argparse.Namespace) -> dict:
    """Print the table; write JSON and the plot when asked."""
    print(results_table(result))
    if args.out:
        common.write_json(args.out, result)
        print(f"results written to {args.out}")
    if args.plot:
        print(f"plot written to {args.plot}" if write_plot(args.plot, result)
              else "no plot: matplotlib is not installed (pip install matplotlib)")
    return result


def run(args: argparse.Namespace) -> dict:
    """Train every chosen optimizer over every seed, then report (or only report merged result files)."""
    common.check_output_path("--out", args.out)
    common.check_output_path("--plot", args.plot)
    if args.merge:
        return report(merge_results(args.merge), args)
    check_sizes(args)
    if args.eval_every < 1:
        raise SystemExit("frost bench: --eval-every must be at least 1")
    device, channels_last, root, jit_on = prepare(args, runs_per_seed=len(args.optimizers))
    result = new_frost_result("resident-" + ("jit" if jit_on else "eager"), "fp32", device, args.steps, args.seeds)
    del result["runs"], result["summary"]
    result.update(schema=SCHEMA, benchmark="optimizers", jit=jit_on, eval_batch=args.eval_batch, optimizers={},
                  protocol={"batch_size": common.PROTOCOL["batch_size"], "steps": args.steps,
                            "eval_every": args.eval_every, "target": args.target,
                            "divergence_factor": DIVERGENCE_FACTOR, "scale": common.PROTOCOL["scale"],
                            "shuffle": common.PROTOCOL["shuffle"], "lr_schedule": "constant",
                            "memory_format": args.memory_format})
    data, _ = load_into(result, args, root, device, "resident", channels_last)
    overrides = dict(args.lr)
    for name in args.optimizers:
        result["optimizers"][name] = entry = describe(BY_NAME[name], overrides)
        if entry["available"]:
            cls = optimizer_class(BY_NAME[name])
            for seed in args.seeds:
                # a diverging run overflows: the loss check reports it, so NumPy need not warn
                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                    entry["runs"].append(train_one_seed(args, BY_NAME[name], cls, entry["lr"], seed, data, device))
                entry["summary"] = summarize(entry["runs"])
                if args.out:
                    common.write_json(args.out, result)  # partial results survive an interrupted run
    return report(result, args)


def describe(recipe: Recipe, overrides: dict) -> dict:
    """The optimizer's entry before training: availability, lr and its reason, line counts of its file."""
    entry = {"class": f"frost.optim.{recipe.cls}", "file": f"frost/optim/{recipe.module}.py",
             "lr": overrides.get(recipe.name, recipe.lr), "lr_default": recipe.lr,
             "why": recipe.why if recipe.name not in overrides else f"set by --lr (the table's {recipe.lr:.3g})",
             "kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in recipe.kwargs.items()},
             "hessian_every": recipe.hessian_every or None, "runs": []}
    path = OPTIM_DIR / f"{recipe.module}.py"
    if path.exists():
        entry.update(line_counts(path))
    try:
        optimizer_class(recipe)
        entry["available"] = True
    except LookupError as e:
        entry.update(available=False, reason=str(e))
    return entry
