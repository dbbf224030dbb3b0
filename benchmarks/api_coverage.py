"""How much of the PyTorch surface that common model code reaches for Frost has: a static name check.

    python benchmarks/api_coverage.py                      # prints present / missing per group
    python benchmarks/api_coverage.py --out coverage.json  # and writes them as JSON

Each group is a PyTorch namespace and the Frost object its names are looked up on (`hasattr`, dotted names one
attribute at a time): torch.nn.functional on frost.nn.functional, torch.Tensor's methods on frost.Tensor, torch's
top-level functions and dtypes on frost, torch.nn's modules on frost.nn, and so on. A name counts as present when
the attribute exists; whether it takes the same arguments and gives the same values is what the test suite checks,
not this script. Nothing is run and torch is not needed; where torch is installed, every listed name is also looked
up in torch, so that a misspelt entry shows up as `not_in_torch` instead of as a false "missing".

How the list was chosen: by hand (December 2026), from reading the model, training and sampling code of five
widely copied projects, keeping each PyTorch name that at least one of them calls:
  - nanoGPT (Karpathy): model.py, train.py, sample.py: a GPT-2 training loop;
  - ResNets: torchvision.models.resnet and timm's resnet.py, with torchvision's references/classification/train.py
    (its optimizers and lr schedulers) as the training loop;
  - DCGAN: pytorch/examples dcgan/main.py (ConvTranspose2d generator, BCELoss, Adam);
  - an audio classifier: the M5 network of torchaudio's speech-commands tutorial (Conv1d, BatchNorm1d, pooling,
    log_softmax + nll_loss, Adam with StepLR, a padding collate);
  - Hugging Face transformers' modeling_gpt2.py (GPT2Attention, GPT2MLP, GPT2Model, GPT2LMHeadModel).
Data-loading names count only where those scripts use them. Names of other libraries (torchaudio's transforms,
timm's layers, HF's Conv1D) are left out: they are those libraries' own code built from the names listed here.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# group -> (Frost module or object to look names up on, names as PyTorch spells them)
GROUPS: dict[str, tuple[str, list[str]]] = {
    "torch.nn.functional": ("frost.nn.functional", [
        "layer_norm", "cross_entropy", "scaled_dot_product_attention", "softmax", "dropout", "relu", "gelu",
        "avg_pool1d", "max_pool1d", "log_softmax", "nll_loss", "adaptive_avg_pool2d", "adaptive_max_pool2d",
        "binary_cross_entropy", "pad", "linear", "embedding",
    ]),
    "torch.Tensor": ("frost.Tensor", [
        "size", "view", "transpose", "contiguous", "split", "masked_fill", "numel", "dim", "item", "backward",
        "to", "pin_memory", "tolist", "mean", "sum", "max", "argmax", "eq", "squeeze", "unsqueeze", "permute",
        "reshape", "flatten", "detach", "fill_", "normal_", "zero_", "copy_", "t", "float", "long", "type_as",
        "expand", "clone", "cpu", "numpy", "softmax", "pow", "matmul", "chunk", "shape", "dtype", "device",
        "requires_grad", "grad", "data",
    ]),
    "torch": ("frost", [
        "tensor", "zeros", "ones", "arange", "cat", "stack", "tril", "full", "randn", "randint", "multinomial",
        "topk", "where", "matmul", "tanh", "pow", "flatten", "argmax", "softmax", "baddbmm", "no_grad",
        "manual_seed", "from_numpy", "save", "load", "finfo", "compile", "float32", "float16", "bfloat16",
        "int64", "long", "bool", "device", "is_tensor", "empty", "ones_like", "zeros_like",
    ]),
    "torch.nn": ("frost.nn", [
        "Module", "Parameter", "Linear", "Embedding", "LayerNorm", "Dropout", "GELU", "ReLU", "ModuleList",
        "ModuleDict", "Sequential", "Identity", "Conv1d", "Conv2d", "ConvTranspose2d", "BatchNorm1d", "BatchNorm2d",
        "MaxPool1d", "MaxPool2d", "AdaptiveAvgPool2d", "Flatten", "LeakyReLU", "Tanh", "Sigmoid", "BCELoss",
        "CrossEntropyLoss",
    ]),
    "torch.nn.init": ("frost.nn.init", ["normal_", "zeros_", "ones_", "constant_", "kaiming_normal_", "uniform_"]),
    "torch.nn.utils": ("frost.nn.utils", ["clip_grad_norm_", "rnn.pad_sequence"]),
    "torch.optim": ("frost.optim", ["AdamW", "Adam", "SGD", "RMSprop", "Optimizer"]),
    "torch.optim.lr_scheduler": ("frost.optim.lr_scheduler", [
        "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LinearLR", "ConstantLR", "SequentialLR",
        "LambdaLR",
    ]),
    "torch.utils.data": ("frost.data", ["DataLoader", "Dataset", "RandomSampler", "SequentialSampler"]),
}


def lookup(root: Any, dotted: str) -> bool:
    """Whether `root` has the attribute path `dotted` (e.g. 'rnn.pad_sequence')."""
    for part in dotted.split("."):
        if not hasattr(root, part):
            return False
        root = getattr(root, part)
    return True


def resolve(path: str) -> Any | None:
    """The module (or the attribute of a module, e.g. frost.Tensor) named `path`, or None where it does not
    import: then every name of its group is missing."""
    try:
        return importlib.import_module(path)
    except ImportError:
        module, _, attribute = path.rpartition(".")
        try:
            return getattr(importlib.import_module(module), attribute, None) if module else None
        except ImportError:
            return None


def torch_root(group: str) -> Any | None:
    """PyTorch's object for `group`, or None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    return resolve(group)


def measure(groups: dict[str, tuple[str, list[str]]] = GROUPS) -> dict[str, Any]:
    """Present and missing names per group, with counts and coverage, and the totals over all groups."""
    result: dict[str, Any] = {}
    for group, (frost_path, names) in groups.items():
        ours, theirs = resolve(frost_path), torch_root(group)
        present = [n for n in names if ours is not None and lookup(ours, n)]
        entry = {"frost": frost_path, "present": present, "missing": [n for n in names if n not in present],
                 "coverage": round(len(present) / len(names), 4)}
        if theirs is not None:
            entry["not_in_torch"] = [n for n in names if not lookup(theirs, n)]
        result[group] = entry
    total = sum(len(names) for _, names in groups.values())
    found = sum(len(entry["present"]) for entry in result.values())
    return {"groups": result, "total": {"names": total, "present": found, "coverage": round(found / total, 4)}}


def commit() -> str | None:
    """The repository's commit (short hash, '+dirty' with uncommitted changes), or None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def report(measured: dict[str, Any]) -> str:
    lines = []
    for group, entry in measured["groups"].items():
        n = len(entry["present"]) + len(entry["missing"])
        lines.append(f"{group:26s} {len(entry['present']):3d}/{n:<3d} {100 * entry['coverage']:5.1f}%  "
                     f"missing: {', '.join(entry['missing']) or '-'}")
        if entry.get("not_in_torch"):
            lines.append(f"{'':26s} not in torch (a list error): {', '.join(entry['not_in_torch'])}")
    total = measured["total"]
    lines.append(f"{'all':26s} {total['present']:3d}/{total['names']:<3d} {100 * total['coverage']:5.1f}%")
    return "\n".join(lines)


# --whole: every public name of these torch namespaces, not only the curated ones (needs torch installed)
WHOLE = {"torch.nn.functional": "frost.nn.functional", "torch.Tensor": "frost.Tensor", "torch.nn": "frost.nn"}


def public_names(group: str, root: Any) -> list[str]:
    """torch.nn.functional's functions, torch.Tensor's public attributes, torch.nn's Module classes."""
    names = [n for n in dir(root) if not n.startswith("_")]
    if group == "torch.nn.functional":
        return [n for n in names if callable(getattr(root, n)) and "torch" in str(getattr(getattr(root, n),
                                                                                           "__module__", ""))]
    if group == "torch.nn":
        module = getattr(root, "Module")
        return [n for n in names if isinstance(getattr(root, n), type) and issubclass(getattr(root, n), module)]
    return names


def whole_groups() -> dict[str, tuple[str, list[str]]]:
    groups = {}
    for group, frost_path in WHOLE.items():
        root = torch_root(group)
        if root is None:
            raise SystemExit("api_coverage: --whole needs torch installed (it lists torch's names)")
        groups[f"{group} (all public)"] = (frost_path, sorted(public_names(group, root)))
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the result as JSON to this file")
    parser.add_argument("--whole", action="store_true",
                        help="every public name of torch.nn.functional, torch.Tensor and torch.nn (needs torch)")
    args = parser.parse_args(argv)
    measured = measure(whole_groups() if args.whole else GROUPS)
    measured["commit"] = commit()
    measured["date"] = datetime.date.today().isoformat()
    print(report(measured))
    if args.out:
        args.out.write_text(json.dumps(measured, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
