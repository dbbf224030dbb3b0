"""The `frost` command: `frost bench resnet-cifar10 [...]` runs the seed benchmark, `frost bench optimizers [...]`
compares the optimizers on it (see --help)."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from frost.bench import optimizers, resnet_cifar10
    parser = argparse.ArgumentParser(prog="frost", description="Frost: a readable deep-learning framework.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="command")
    bench = commands.add_parser("bench", help="run a benchmark")
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="benchmark")
    seed = benchmarks.add_parser(
        "resnet-cifar10", help="the seed ResNet on CIFAR-10 (batch 32, AdamW, 20,000 steps, 3 seeds)",
        description=resnet_cifar10.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    resnet_cifar10.add_arguments(seed)
    seed.set_defaults(handler=resnet_cifar10.run)
    zoo = benchmarks.add_parser(
        "optimizers", help="the seed ResNet on CIFAR-10 with each optimizer (SGD, AdamW, Lion, Muon, SophiaG, ...)",
        description=optimizers.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    optimizers.add_arguments(zoo)
    zoo.set_defaults(handler=optimizers.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run the command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        import frost
        print(f"frost {frost.__version__}")
        return 0
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    handler(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
