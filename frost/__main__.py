"""`python -m frost ...`: the `frost` command (frost.cli)."""
import sys

from frost.cli import main

if __name__ == "__main__":  # importing the module (as the kernel-package test does) must not run the command
    sys.exit(main())
