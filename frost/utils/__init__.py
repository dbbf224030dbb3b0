"""frost.utils: helpers around training, as torch.utils (checkpoint: activation checkpointing)."""
from frost.utils import checkpoint

__all__ = ["checkpoint"]
