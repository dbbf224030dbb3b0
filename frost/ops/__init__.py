"""Every differentiable operation, one family per file, forward and backward side by side."""
