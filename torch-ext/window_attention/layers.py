"""Layers for `kernels.kernelize` (`kernel.layers.<Name>`).

A kernels layer has no `__init__` and no state of its own: `kernelize` swaps it in as the `forward` of an existing
module and it reads that module's attributes (annotated below). Only relative imports, the standard library and torch.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

try:
    from .interface import attention, window_attention
except ImportError:  # the pure-PyTorch reference package (winattn.load(..., fallback="reference")) has no _ops
    from .reference import attention, window_attention


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


def _no_attention_dropout(module: nn.Module, layer: str) -> None:
    attn_drop = getattr(module.attn_drop, "p", 0.0)
    if module.training and attn_drop > 0.0:
        raise ValueError(f"window_attention.layers.{layer} does not implement attention dropout (attn_drop={attn_drop})")


class BeitAttention(nn.Module):
    """Forward of timm's BEiT `Attention` (`timm.models.beit.Attention`) on the fused kernel.

    With a relative-position table (`use_rel_pos_bias`) the bias is gathered from it ((2W-1)^2 + 3 rows, the last
    three for class -> patch, patch -> class and class -> class; an [N, N] index with N = W^2 + 1, 197 for BEiT-B/16
    at 224 px) into one [1, nH, N, N] bias that the kernel adds in the softmax and returns dBias for (reduced over the
    batch on the GPU); autograd scatters it into the table. A `shared_rel_pos_bias` ([nH, N, N], the model-level
    `RelativePositionBias` of `use_shared_rel_pos_bias`) is added to it (or is the only bias). q/k/v biases (`q_bias`, zero `k_bias`, `v_bias`; `qkv_bias_separate`) as
    timm. Same signature as timm's forward.

    Attention dropout is not implemented: in training mode a module with `attn_drop.p > 0` raises.

    Shapes:
        x: [B, N, C]; shared_rel_pos_bias: None or float broadcastable to [B, nH, N, N]. returns [B, N, C].
    """

    can_torch_compile: bool = True
    has_backward: bool = True

    # Attributes of timm's beit.Attention that this forward reads.
    qkv: nn.Linear
    q_bias: Optional[nn.Parameter]
    k_bias: Optional[torch.Tensor]
    v_bias: Optional[nn.Parameter]
    qkv_bias_separate: bool
    proj: nn.Linear
    proj_drop: nn.Module
    attn_drop: nn.Module
    relative_position_bias_table: Optional[nn.Parameter]
    relative_position_index: Optional[torch.Tensor]
    num_heads: int
    scale: float

    def forward(self, x: torch.Tensor, shared_rel_pos_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        _no_attention_dropout(self, "BeitAttention")
        B, N, _ = x.shape
        if self.q_bias is None:
            qkv = self.qkv(x)
        else:
            qkv_bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
            if getattr(self, "qkv_bias_separate", False):  # (older timm versions lack it)
                qkv = self.qkv(x)
                qkv += qkv_bias
            else:
                qkv = F.linear(x, weight=self.qkv.weight, bias=qkv_bias)
        # [B, N, 3, nH, hd] -> q, k, v as strided [B, N, nH, hd] views (the kernel reads them by stride).
        q, k, v = qkv.reshape(B, N, 3, self.num_heads, -1).unbind(2)
        bias = shared_rel_pos_bias
        if self.relative_position_bias_table is not None:
            # The table gathered here into a [1, nH, N, N] bias (1.9 MB at BEiT-B), not through window_attention's
            # table term: a table gradient outside window shapes (head dim 64, N = 197) is reduced by the ordered v1
            # backward, while a learnable bias takes backward v3 with dBias reduced over the batch on the GPU (and
            # autograd scatters it into the table, as timm's own gather does).
            N_ = self.relative_position_index.shape[-1] if self.relative_position_index.dim() == 2 else N
            rel = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
            rel = rel.reshape(N_, N_, -1).permute(2, 0, 1).unsqueeze(0)
            bias = rel if bias is None else rel + bias
        out = attention(q, k, v, bias=bias, scale=self.scale)
        x = self.proj(out.reshape(B, N, -1))
        return self.proj_drop(x)


class RelPosAttention(nn.Module):
    """Forward of timm's `RelPosAttention` (`timm.models.vision_transformer_relpos`, the `vit_relpos_*` /
    `vit_srelpos_*` models) on the fused kernel.

    The bias comes from the module's `rel_pos`, as in timm:
      * `RelPosBias` (rel_pos_type="bias"): its table ((2W-1)^2 rows, + 3 with a class token) is gathered by the
        module (`rel_pos.get_bias()`) into [1, nH, N, N] and passed as `bias=`; the kernel's dBias flows into the table;
      * `RelPosMlp` (the default, "mlp" / "mlp_swin"): the bias is computed by the module (`rel_pos.get_bias()`, an
        MLP on log-spaced coordinates, [1, nH, N, N]) and passed as `bias=`; its gradient flows back into the MLP;
      * no `rel_pos`: `shared_rel_pos` (the model-level bias of `shared_rel_pos=True`) is the bias, or none.
    As timm, `shared_rel_pos` is ignored when the module has its own `rel_pos`. q / k norms (`qk_norm`) as timm.
    Any other `rel_pos` class goes through `get_bias()` as timm's fused path does; `kernelize_relpos` leaves such
    modules on timm's forward instead. Same signature as timm's forward.

    Attention dropout is not implemented: in training mode a module with `attn_drop.p > 0` raises.

    Shapes:
        x: [B, N, C]; shared_rel_pos: None or float broadcastable to [B, nH, N, N]. returns [B, N, C].
    """

    can_torch_compile: bool = True
    has_backward: bool = True

    # Attributes of timm's RelPosAttention that this forward reads.
    qkv: nn.Linear
    q_norm: nn.Module
    k_norm: nn.Module
    rel_pos: Optional[nn.Module]
    proj: nn.Linear
    proj_drop: nn.Module
    attn_drop: nn.Module
    num_heads: int
    scale: float

    def forward(self, x: torch.Tensor, shared_rel_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        _no_attention_dropout(self, "RelPosAttention")
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).unbind(2)
        if getattr(self, "q_norm", None) is not None:  # qk_norm (absent in older timm); over the head dim
            q = self.q_norm(q)
            k = self.k_norm(k)
        rel_pos = self.rel_pos
        if rel_pos is None:
            out = attention(q, k, v, bias=shared_rel_pos, scale=self.scale)
        else:  # (RelPosBias gathers its table here, as BeitAttention does: backward v3 with dBias)
            out = attention(q, k, v, bias=rel_pos.get_bias(), scale=self.scale)
        x = self.proj(out.reshape(B, N, -1))
        return self.proj_drop(x)


__all__ = ["WindowAttention", "BeitAttention", "RelPosAttention"]
