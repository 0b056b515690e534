"""Pure-PyTorch reference of the window-attention kernels.

Same semantics as the compiled op (see kernel-src/winattn_params.h), computed in float32 (float64 when the inputs
are float64) with full [B, H, Sq, Sk] score matrices. It is the golden model of the tests and the explicit fallback
when no compiled variant fits (`winattn.load(..., fallback="reference")`). Gradients come from autograd.
"""

from typing import Optional, Tuple

import torch

from ._args import attention_args, check_flag, window_attention_args

_REFERENCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
BUILD_DEVICE = None  # the reference runs on any device (a compiled build says "cpu" or "cuda")


def _tile_batch(t: torch.Tensor, batch: int) -> torch.Tensor:
    """[P, ...] -> [B, ...] with row b = t[b % P] (the op's batch-period rule)."""
    return t if t.shape[0] in (1, batch) else t.repeat(batch // t.shape[0], *([1] * (t.dim() - 1)))


def visible_keys(
    B: int, Sq: int, Sk: int, device, mask=None, key_padding_mask=None, causal=False, window_left=-1,
    window_right=-1,
) -> Optional[torch.Tensor]:
    """Bool [B|1, H|1, Sq, Sk] of keys each query may attend to, or None when all are visible."""
    visible = None

    def both(a, b):
        return b if a is None else a & b

    if mask is not None:
        visible = both(visible, _tile_batch(mask, B))
    if key_padding_mask is not None:
        visible = both(visible, key_padding_mask[:, None, None, :])
    if causal or window_left >= 0 or window_right >= 0:
        i = torch.arange(Sq, device=device)[:, None]
        j = torch.arange(Sk, device=device)[None, :]
        d = j - i - (Sk - Sq)  # bottom-right aligned
        band = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
        if causal:
            band &= d <= 0
        if window_right >= 0:
            band &= d <= window_right
        if window_left >= 0:
            band &= d >= -window_left
        visible = both(visible, band[None, None])
    return visible


def fwd(
    q, k, v, bias=None, mask=None, key_padding_mask=None, rel_pos_table=None, rel_pos_index=None, scale=1.0,
    causal=False, window_left=-1, window_right=-1, deterministic=False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Op-level forward: (out [B, Sq, H, D] in q's dtype, lse [B, H, Sq] float32)."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf = q.to(acc).transpose(1, 2)
    kf = k.to(acc).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    vf = v.to(acc).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + _tile_batch(bias.to(acc), B)
    if rel_pos_table is not None:
        s = s + rel_pos_table.to(acc)[rel_pos_index].permute(2, 0, 1)
    visible = visible_keys(B, Sq, Sk, q.device, mask, key_padding_mask, causal, window_left, window_right)
    if bias is not None or rel_pos_table is not None:
        # An additive -inf hides its key as a mask does; masking it also keeps a row hidden entirely that way from
        # sending NaN (logsumexp's gradient at lse = -inf) into the gradients.
        finite = ~torch.isneginf(s)
        visible = finite if visible is None else visible & finite
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # Rows with no visible key: lse = -inf, p = 0 (a finite shift keeps exp() and its gradient NaN-free). Only those:
    # a row with a visible +inf score (bias or table) has lse = +inf, and s - lse is NaN at that key, so out is NaN,
    # as the kernels and SDPA give (shifting it by 0 instead gave +-inf); its lse is NaN too, as the kernels give.
    empty = torch.isneginf(lse)
    p = torch.exp(s - torch.where(empty, torch.zeros_like(lse), lse).unsqueeze(-1))
    out = (p @ vf).transpose(1, 2).to(q.dtype)
    lse = torch.where(torch.isposinf(lse), torch.full_like(lse, float("nan")), lse)
    return out, lse.float()


def attention(
    q, k, v, *, bias=None, mask=None, key_padding_mask=None, causal=False, window=None, scale=None,
    return_lse=False, deterministic=False,
):
    """Reference `window_attention.attention` (same signature and semantics)."""
    a = attention_args(
        q, k, v, bias=bias, mask=mask, key_padding_mask=key_padding_mask, causal=causal, window=window,
        scale=scale, deterministic=deterministic, allowed_dtypes=_REFERENCE_DTYPES,
    )
    out, lse = fwd(*a.as_tuple())
    return (out, lse) if check_flag(return_lse, "return_lse") else out


def window_attention(q, k, v, *, rel_pos_table=None, rel_pos_index=None, bias=None, mask=None, scale=None):
    """Reference `window_attention.window_attention` (same signature and semantics)."""
    a = window_attention_args(
        q, k, v, rel_pos_table=rel_pos_table, rel_pos_index=rel_pos_index, bias=bias, mask=mask, scale=scale,
        allowed_dtypes=_REFERENCE_DTYPES,
    )
    return fwd(*a.as_tuple())[0]


def attention_forward(q, k, v, *, bias=None, mask=None, key_padding_mask=None, causal=False, window=None, scale=None,
                      deterministic=False):
    """Reference `window_attention.attention_forward`: (out, lse) without autograd."""
    a = attention_args(
        q, k, v, bias=bias, mask=mask, key_padding_mask=key_padding_mask, causal=causal, window=window,
        scale=scale, deterministic=deterministic, allowed_dtypes=_REFERENCE_DTYPES,
    )
    with torch.no_grad():
        return fwd(*a.as_tuple())


def attention_backward(grad_out, q, k, v, out, lse, *, bias=None, mask=None, key_padding_mask=None, causal=False,
                       window=None, scale=None, deterministic=False, bias_requires_grad=False, grad_lse=None):
    """Reference `window_attention.attention_backward`: the flash-attention backward formulas in float32 (float64
    for float64 inputs), dS = P * (dP - rowsum(dO * O) + dlse), for the given out/lse (a ring chunk's share when they
    belong to a larger attention). Returns (dq, dk, dv, dbias)."""
    a = attention_args(
        q, k, v, bias=bias, mask=mask, key_padding_mask=key_padding_mask, causal=causal, window=window,
        scale=scale, deterministic=deterministic, allowed_dtypes=_REFERENCE_DTYPES,
    )
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    with torch.no_grad():
        qf = q.to(acc).transpose(1, 2)
        kf = k.to(acc).transpose(1, 2).repeat_interleave(G, dim=1)
        vf = v.to(acc).transpose(1, 2).repeat_interleave(G, dim=1)
        s = (qf @ kf.transpose(-1, -2)) * a.scale
        if a.bias is not None:
            s = s + _tile_batch(a.bias.to(acc), B)
        visible = visible_keys(B, Sq, Sk, q.device, a.mask, a.key_padding_mask, a.causal, a.window_left,
                               a.window_right)
        lse = lse.to(acc)
        # rows that see a key; a NaN lse (a visible +inf score) gives NaN gradients, as the kernels do
        finite = ~torch.isneginf(lse)
        p = torch.exp(s - torch.where(finite, lse, torch.zeros_like(lse)).unsqueeze(-1)) * finite.unsqueeze(-1)
        if a.bias is not None:
            p = p * ~torch.isneginf(s)
        if visible is not None:
            p = p * visible
        do = grad_out.to(acc).transpose(1, 2)
        o = out.to(acc).transpose(1, 2)
        dv = p.transpose(-1, -2) @ do
        dp = do @ vf.transpose(-1, -2)
        delta = (do * o).sum(-1, keepdim=True)
        if grad_lse is not None:
            delta = delta - torch.where(finite, grad_lse.to(acc), torch.zeros_like(lse)).unsqueeze(-1)
        ds = p * (dp - delta)
        dq = (ds @ kf) * a.scale
        dk = (ds.transpose(-1, -2) @ qf) * a.scale
        if G > 1:
            dk = dk.view(B, Hkv, G, Sk, D).sum(2)
            dv = dv.view(B, Hkv, G, Sk, D).sum(2)
        dbias = None
        if check_flag(bias_requires_grad, "bias_requires_grad") and bias is not None:
            view = a.bias  # [P, Hb, Rq, Rk], broadcast dims of size 1: sum dS over them
            ds_p = ds.reshape(B // view.shape[0], view.shape[0], H, Sq, Sk).sum(0)
            dims = [i for i in range(4) if view.shape[i] == 1 and ds_p.shape[i] != 1]
            dbias = (ds_p.sum(dims, keepdim=True) if dims else ds_p).float().reshape(bias.shape)
    return (dq.transpose(1, 2).to(q.dtype), dk.transpose(1, 2).to(k.dtype), dv.transpose(1, 2).to(v.dtype), dbias)
