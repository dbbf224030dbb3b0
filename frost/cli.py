"""The `frost` command: `frost bench` lists the benchmarks; `frost bench resnet-cifar10 [...]` runs the seed
benchmark, `frost bench optimizers [...]` compares the optimizers on it (see --help). Also `python -m frost`."""
from __future__ import annotations

import argparse
import sys

from frost import __version__
from frost.bench import gpt, optimizers, resnet_cifar10
from frost.distributed import run as distributed_run

# name -> (one-line summary, module with add_arguments and run, and whose docstring is the --help description)
BENCHMARKS = {
    "resnet-cifar10": ("the seed ResNet on CIFAR-10 (batch 32, AdamW, 20,000 steps, 3 seeds; a one-minute run on "
                       "the embedded sample without the data)", resnet_cifar10),
    "optimizers": ("the seed ResNet on CIFAR-10 with each optimizer (SGD, AdamW, Lion, Muon, SophiaG, ...)",
                   optimizers),
    "gpt": ("a GPT (frost.models.gpt) on a token corpus: nanoGPT's shakespeare-char or GPT-2 124M, ms/step, "
            "tokens/s and held-out loss", gpt),
}


def add_verbose(p: argparse.ArgumentParser, default=False) -> None:
    # on the command and on every subcommand (`frost --verbose bench ...` and `frost bench X --verbose`); a
    # subcommand's default is SUPPRESS so that it does not overwrite the flag given before it
    p.add_argument("--verbose", action="store_true", default=default,
                   help="on an error, print the full traceback instead of one line")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frost", description="Frost: a readable deep-learning framework.")
    parser.add_argument("--version", action="version", version=f"frost {__version__}")
    add_verbose(parser)
    commands = parser.add_subparsers(dest="command", metavar="command")
    bench = commands.add_parser("bench", help="run a benchmark (alone: list them)", description=list_benchmarks(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_verbose(bench, argparse.SUPPRESS)
    bench.set_defaults(handler=lambda args: print(list_benchmarks()))
    # parsed by frost.distributed.run itself (main hands it the arguments): listed here for --help
    commands.add_parser("run", help="start N data-parallel processes (frost run --help)", add_help=False)
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="benchmark")
    for name, (summary, module) in BENCHMARKS.items():
        sub = benchmarks.add_parser(name, help=summary, description=module.__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        add_verbose(sub, argparse.SUPPRESS)
        sub.set_defaults(handler=module.run)
    return parser


def list_benchmarks() -> str:
    width = max(map(len, BENCHMARKS))
    rows = [f"  {name:<{width}}  {summary}" for name, (summary, _) in BENCHMARKS.items()]
    return "\n".join(["benchmarks (frost bench NAME --help for the options):", *rows])


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run the command; returns the exit status. An error is one line on
    stderr and status 1 (the traceback with --verbose); a refusal (SystemExit with a message) exits with it."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:
        return distributed_run.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = list(argv)  # a benchmark may run itself again (--nproc-per-node: in N processes)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        handler(args)
    except KeyboardInterrupt:
        if args.verbose:
            raise
        print("frost: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.verbose:
            raise
        print(f"frost: {one_line(e)} (--verbose shows the traceback)", file=sys.stderr)
        return 1
    return 0


def one_line(error: BaseException) -> str:
    """The error's type and its message's first line."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}{' ...' if len(lines) > 1 else ''}" if lines else type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
