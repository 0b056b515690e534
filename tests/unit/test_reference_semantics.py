"""The reference implementation itself, checked against torch's SDPA (an independent implementation).

Every kernel test compares against `reference`, so its semantics are pinned here: bias broadcasting, bool masks,
bottom-right causal alignment, sliding windows, GQA, Swin table gather with the window-periodic shift mask, and
fully-masked rows.
"""

import pytest
import torch
import torch.nn.functional as F


def _sdpa(q, k, v, attn_mask=None, scale=None):
    """SDPA in [B, S, H, D] layout (float64, math backend)."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, scale=scale
    )
    return out.transpose(1, 2)


def _qkv(B=2, Sq=33, Sk=40, H=4, Hkv=4, D=16):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, Sq, H, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Sk, Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Sk, Hkv, D, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("bias_shape", [(1, 4, 33, 40), (2, 1, 33, 40), (2, 4, 1, 40), (33, 40), (4, 1, 1)])
def test_bias_and_bool_mask_match_sdpa(kernel, bias_shape):
    q, k, v = _qkv()
    bias = torch.randn(bias_shape, dtype=torch.float64)
    mask = torch.rand(2, 1, 33, 40) > 0.3
    mask[..., 0] = True  # keep every row non-empty (SDPA returns NaN for empty rows)
    out = kernel.reference.attention(q, k, v, bias=bias, mask=mask)
    expected = _sdpa(q, k, v, attn_mask=bias.expand(2, 4, 33, 40).masked_fill(~mask, float("-inf")))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("Sq,Sk", [(40, 40), (20, 40), (40, 20)])
def test_causal_is_bottom_right_aligned(kernel, Sq, Sk):
    q, k, v = _qkv(Sq=Sq, Sk=Sk)
    i = torch.arange(Sq)[:, None]
    j = torch.arange(Sk)[None, :]
    allowed = j <= i + (Sk - Sq)
    out = kernel.reference.attention(q, k, v, causal=True)
    live = allowed.any(-1)  # rows with no visible key (Sq > Sk) are zero by contract
    expected = _sdpa(q, k, v, attn_mask=torch.where(allowed, 0.0, float("-inf")).double())
    torch.testing.assert_close(out[:, live], expected[:, live])
    assert (out[:, ~live] == 0).all()


def test_sliding_window_and_gqa(kernel):
    q, k, v = _qkv(Sq=40, Sk=40, H=4, Hkv=2)
    i = torch.arange(40)[:, None]
    j = torch.arange(40)[None, :]
    allowed = (j - i <= 2) & (j - i >= -5)
    out = kernel.reference.attention(q, k, v, window=(5, 2))
    expected = _sdpa(q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2),
                     attn_mask=torch.where(allowed, 0.0, float("-inf")).double())
    torch.testing.assert_close(out, expected)


def test_fully_masked_rows_are_zero_with_minus_inf_lse_and_zero_grads(kernel):
    q, k, v = (t.requires_grad_() for t in _qkv())
    kpm = torch.ones(2, 40, dtype=torch.bool)
    kpm[1] = False  # batch 1 sees no key at all
    out, lse = kernel.reference.attention(q, k, v, key_padding_mask=kpm, return_lse=True)
    assert (out[1] == 0).all() and torch.isneginf(lse[1]).all() and torch.isfinite(lse[0]).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[1] == 0).all() and (k.grad[1] == 0).all()


def test_swin_table_gather_and_periodic_shift_mask(kernel):
    nW, B, N, H, D, W = 4, 2, 9, 2, 8, 3
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B * nW, N, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    table = torch.randn((2 * W - 1) ** 2, H, generator=g, dtype=torch.float64)
    index = torch.randint(0, table.shape[0], (N, N), generator=g)
    shift = torch.where(torch.rand(nW, N, N, generator=g) > 0.7, -100.0, 0.0).double()
    out = kernel.reference.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=shift)
    rel = table.float().double()[index].permute(2, 0, 1)  # [H, N, N]; the op takes the table in float32
    bias = rel[None] + shift.repeat(B, 1, 1)[:, None]  # batch b uses window b % nW
    torch.testing.assert_close(out, _sdpa(q, k, v, attn_mask=bias))
