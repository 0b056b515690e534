"""window-attention: fused attention with an additive bias, masks, Swin relative-position tables and dBias.

Load it with `kernels.get_kernel("winattn/window-attention", version=1)` or `winattn.load()`.
`reference` holds the pure-PyTorch implementation with the same API.
"""

from . import layers, reference
from .interface import attention, window_attention

__all__ = ["attention", "window_attention", "layers", "reference"]
