"""Optimizers (one file each: the update as a pure function on arrays, then its class) and lr schedules."""
from frost.optim.optimizer import Optimizer
from frost.optim.sgd import SGD, sgd_update
from frost.optim.adam import Adam, adam_update
from frost.optim.adamw import AdamW, adamw_update
from frost.optim.lion import Lion, lion_update
from frost.optim.adafactor import Adafactor, adafactor_update
from frost.optim.lamb import LAMB, lamb_update
from frost.optim.muon import Muon, muon_update
from frost.optim.sophia import SophiaG, sophiag_update
from frost.optim.rmsprop import RMSprop, rmsprop_update
from frost.optim.adagrad import Adagrad, adagrad_update
from frost.optim import lr_scheduler
from frost.optim import schedule  # the old name of lr_scheduler: the same module

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "sgd_update", "adam_update", "adamw_update", "schedule",
           "lr_scheduler"]
__all__ += ["Lion", "lion_update", "Adafactor", "adafactor_update", "LAMB", "lamb_update"]
__all__ += ["Muon", "muon_update", "SophiaG", "sophiag_update"]
__all__ += ["RMSprop", "rmsprop_update", "Adagrad", "adagrad_update"]
