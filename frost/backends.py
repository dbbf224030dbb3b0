"""Global backend switches, PyTorch-style: frost.backends.allow_tf32."""

# TF32 tensor cores for float32 matmuls and convolutions on the GPU (as PyTorch does for convolutions).
allow_tf32 = True

# Only deterministic algorithms (cuDNN plans without atomics), so that two runs give identical bits.
deterministic = False
