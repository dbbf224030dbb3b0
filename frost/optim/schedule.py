"""The old name of frost.optim.lr_scheduler: `frost.optim.schedule` and `from frost.optim.schedule import ...` give
that same module (one module object, so its classes are the same classes)."""
import sys

from frost.optim import lr_scheduler

sys.modules[__name__] = lr_scheduler
