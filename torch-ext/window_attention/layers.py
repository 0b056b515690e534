"""Layers for `kernels.kernelize` (`kernel.layers.<Name>`).

A kernels layer has no `__init__` and no state of its own: `kernelize` swaps it in as the `forward` of an existing
module and it reads that module's attributes (annotated below). Only relative imports, the standard library and torch.
"""

from typing import Optional

import torch
from torch import nn

try:
    from .interface import window_attention
except ImportError:  # the pure-PyTorch reference package (winattn.load(..., fallback="reference")) has no _ops
    from .reference import window_attention


class WindowAttention(nn.Module):
    """Forward of timm's Swin (v1) `WindowAttention` on the fused kernel.

    The relative-position bias table is gathered inside the kernel (never expanded to [nH, N, N]) and gets its
    gradient from the kernel's dBias pass; the shifted-window mask is added in the kernel as well. Same signature as
    `timm.models.swin_transformer.WindowAttention.forward`.

    Attention dropout is not implemented: in training mode a module with `attn_drop.p > 0` raises. SwinV2's cosine
    attention (`logit_scale`, `cpb_mlp`) is a different computation and is refused.

    Shapes:
        x: [B * nW, N, C] (N = window area); mask: None or additive float [nW, N, N] (0 / -100 shift mask).
        returns [B * nW, N, C].
    """

    can_torch_compile: bool = True
    has_backward: bool = True

    # Attributes of timm's WindowAttention that this forward reads.
    qkv: nn.Linear
    proj: nn.Linear
    proj_drop: nn.Module
    attn_drop: nn.Module
    relative_position_bias_table: nn.Parameter
    relative_position_index: torch.Tensor
    num_heads: int
    scale: float

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if getattr(self, "logit_scale", None) is not None or getattr(self, "cpb_mlp", None) is not None:
            raise TypeError(
                "window_attention.layers.WindowAttention implements Swin v1 attention (scaled dot product + "
                "relative-position bias table); this module is SwinV2 cosine attention (logit_scale, cpb_mlp)"
            )
        attn_drop = getattr(self.attn_drop, "p", 0.0)
        if self.training and attn_drop > 0.0:
            raise ValueError(
                f"window_attention.layers.WindowAttention does not implement attention dropout (attn_drop={attn_drop})"
            )
        B_, N, C = x.shape
        # [B_, N, 3, nH, hd] -> q, k, v as strided [B_, N, nH, hd] views (the kernel reads them by stride).
        q, k, v = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).unbind(2)
        out = window_attention(
            q,
            k,
            v,
            rel_pos_table=self.relative_position_bias_table,
            rel_pos_index=self.relative_position_index,
            mask=mask,
            scale=getattr(self, "scale", None),
        )
        x = self.proj(out.reshape(B_, N, -1))
        return self.proj_drop(x)


__all__ = ["WindowAttention"]
