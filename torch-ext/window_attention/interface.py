"""Public API on top of the compiled ops: argument checks, autograd and fake (meta) implementations.

`fwd`/`bwd` are defined in torch-ext/torch_binding.cpp. Autograd and fake kernels are registered through
`torch.library` with `add_op_namespace_prefix`, so each build keeps its own namespace (two builds can be loaded side
by side) and `torch.compile(fullgraph=True)` traces the ops without graph breaks. Eager calls of the functions
below skip the registered Python autograd kernel and enter the op directly (_autograd.run_fwd: same formula, a
fraction of the host time); their argument checks are cached per call signature (_args.py).
"""

import torch
import torch.fx.node

from . import _autograd
from ._args import OpArgs, attention_op_args, check_flag, window_attention_op_args
from ._index_bounds import check_rel_pos_index
from ._ops import add_op_namespace_prefix, ops

BUILD_DEVICE = "cuda" if "_cuda_" in add_op_namespace_prefix("") else "cpu"  # the device this build runs on
_BUILD_DEVICE = BUILD_DEVICE  # the name before it was public (kernels fetched by an older winattn read it)
# The CPU op range-checks rel_pos_index on every call before any kernel runs (host memory: no sync, ~0.4 us for a
# 7x7 window; torch_binding.cpp check_index_range), so on CPU the Python check (~0.7 us per call: the cached
# identity + version lookup of _index_bounds.py) would only repeat it. window_attention skips it there and turns
# the op's RuntimeError into the IndexError that check_rel_pos_index raises on every build (_index_error below).
_OP_CHECKS_INDEX = BUILD_DEVICE == "cpu"


@torch.library.register_fake(add_op_namespace_prefix("fwd"))
def _fwd_fake(q, k, v, bias, mask, key_padding_mask, rel_pos_table, rel_pos_index, scale, causal, window_left,
              window_right, deterministic):
    B, Sq, H, D = q.shape
    return q.new_empty((B, Sq, H, D)), q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.register_fake(add_op_namespace_prefix("bwd"))
def _bwd_fake(grad_out, q, k, v, out, lse, bias, mask, key_padding_mask, rel_pos_table, rel_pos_index, scale, causal,
              window_left, window_right, bias_requires_grad, table_requires_grad, deterministic, grad_lse=None):
    dbias = q.new_empty(bias.shape, dtype=bias.dtype) if bias_requires_grad else q.new_empty((0,), dtype=torch.float32)
    dtable = q.new_empty(rel_pos_table.shape if table_requires_grad else (0,), dtype=torch.float32)
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape), dbias, dtable)


# The formula for torch.ops callers and torch.compile; eager calls of the API below take _autograd.run_fwd (same
# formula, no Python autograd kernel in the way: see _autograd.py).
torch.library.register_autograd(
    add_op_namespace_prefix("fwd"), _autograd.backward, setup_context=_autograd.setup_context
)


# The rel_pos_index range check as a graph op. While torch.compile traces, the index is a fake tensor and the
# eager check in _args is skipped; this op puts the check into the compiled graph, where it runs on the real
# tensor before the kernel (the same first-seen cache: a module buffer is the same tensor object every call, so
# the steady state is still sync-free). It returns nothing, so it is marked side-effecting to survive dead-code
# elimination.
@torch.library.custom_op(add_op_namespace_prefix("check_rel_pos_index"), mutates_args=())
def _check_rel_pos_index(index: torch.Tensor, rows: int) -> None:
    check_rel_pos_index(index, rows)


@_check_rel_pos_index.register_fake
def _check_rel_pos_index_fake(index, rows):
    return None


torch.fx.node.has_side_effect(_check_rel_pos_index._opoverload)


def _check_device(q):
    """This build's device and dtype (run with the argument checks, and cached with them: see _args.py)."""
    if q.device.type != BUILD_DEVICE:
        raise ValueError(
            f"this window-attention build runs on {BUILD_DEVICE} tensors, got {q.device}; load the "
            f"variant for {q.device.type} or use window_attention.reference"
        )
    if q.dtype == torch.float32 and BUILD_DEVICE == "cuda":
        raise ValueError("the CUDA kernels take float16 or bfloat16 q/k/v, got float32")


def attention(
    q, k, v, *, bias=None, mask=None, key_padding_mask=None, causal=False, window=None, scale=None,
    return_lse=False, deterministic=False,
):
    """Fused attention with an additive bias and masks.

    Args:
        q: [B, Sq, H, D]; k, v: [B, Sk, H_kv, D] with H_kv dividing H (GQA/MQA). Any strides with a contiguous
            last dim; float16/bfloat16 (float32 on CPU); D a multiple of 8, at most 256.
        bias: float tensor broadcastable to [B, H, Sq, Sk] (read by stride, never expanded). Its gradient is
            returned reduced to bias's own shape.
        mask: bool tensor broadcastable to [B, H, Sq, Sk], True = attend.
        key_padding_mask: bool [B, Sk], True = real token.
        causal: bottom-right aligned causal mask (as flash-attention). `causal`, `return_lse` and `deterministic`
            are bools (TypeError otherwise, as SDPA's `is_causal`).
        window: (left, right) int sides of a sliding window around the bottom-right aligned diagonal; -1/None =
            unbounded (TypeError for a float or bool side; a side beyond Sq + Sk is unbounded in effect).
        scale: softmax scale, default 1/sqrt(D): a real number or a one-element tensor (TypeError for a string;
            ValueError when NaN, infinite or past float32's range, in which the kernels compute).
        return_lse: also return lse [B, H, Sq] float32 (natural log).
        deterministic: bit-identical gradients for identical inputs.

    Rows whose keys are all masked return 0 with lse = -inf, and get zero gradients. A NaN, or a +inf (bias, table),
    among a row's visible scores gives NaN out and lse in that row, as SDPA does; a hidden key stays hidden whatever
    its score.

    Shapes:
        returns [B, Sq, H, D] (and [B, H, Sq] with return_lse).
    """
    check_flag(return_lse, "return_lse")
    compiling = torch.compiler.is_compiling()
    args = attention_op_args(q, k, v, bias, mask, key_padding_mask, causal, window, scale, deterministic,
                             device_check=_check_device, compiling=compiling)
    out, lse = _autograd.run_fwd(args, return_lse, compiling)
    return (out, lse) if return_lse else out


def window_attention(q, k, v, *, rel_pos_table=None, rel_pos_index=None, bias=None, mask=None, scale=None):
    """Swin (shifted) window attention with the relative-position bias gathered inside the kernel.

    Args:
        q, k, v: [B * nW, N, H, D] (N = window area, e.g. 49 for 7x7 windows).
        rel_pos_table: [T, H] relative-position bias table (gets a gradient); any row count T, e.g. (2W-1)^2 for
            Swin, (2W-1)^2 + 3 for BEiT (its class-token entries).
        rel_pos_index: [N, N] integer index into the table (or the same flattened to [N * N], as timm's RelPosBias
            keeps it), every entry in [0, T): IndexError otherwise (checked when an index tensor is first seen and
            after each in-place change, see _index_bounds.py).
        bias: optional extra float bias broadcastable to [B * nW, H, N, N].
        mask: optional additive float [nW, N, N] shift mask; window index = batch index mod nW.
        scale: default 1/sqrt(D).

    Shapes:
        returns [B * nW, N, H, D].
    """
    compiling = torch.compiler.is_compiling()
    args = window_attention_op_args(q, k, v, rel_pos_table, rel_pos_index, bias, mask, scale,
                                    device_check=_check_device, compiling=compiling,
                                    op_checks_index=_OP_CHECKS_INDEX)
    if rel_pos_index is None:
        return _autograd.run_fwd(args, False, compiling)[0]
    if compiling:
        # the caller's tensor, not the op's index: an int32 index becomes a new int64 tensor on every call
        _check_rel_pos_index(rel_pos_index, rel_pos_table.shape[0])
        return _autograd.run_fwd(args, False, compiling)[0]
    if not _OP_CHECKS_INDEX:
        return _autograd.run_fwd(args, False, compiling)[0]
    try:
        return _autograd.run_fwd(args, False, compiling)[0]
    except RuntimeError as err:
        if "rel_pos_index" not in str(err):
            raise
        op_error = err
    _index_error(rel_pos_index, rel_pos_table.shape[0], op_error)


def _index_error(index, rows, op_error):
    """The CPU op refused an out-of-range rel_pos_index: raise the IndexError (value, position, range) that
    check_rel_pos_index gives on every build, from the caller's own tensor (outside the `except` block, so it does
    not carry the op's error as its context)."""
    check_rel_pos_index(index, rows)
    raise op_error  # the check found nothing: the op's own error is the best account


# ----------------------------------------------------------------------------------------------------------------
# Low-level ops (no autograd), FA2's `flash_attn_varlen_fwd` / `bwd` role: what integrations that run their own
# backward (diffusers' context parallelism) call. Keyword arguments only after q/k/v, stable across kernel versions
# with the same API_VERSION.


def attention_forward(q, k, v, *, bias=None, mask=None, key_padding_mask=None, causal=False, window=None, scale=None,
                      deterministic=False):
    """Forward of `attention` without autograd.

    Args: as `attention`.

    Shapes:
        returns (out [B, Sq, H, D] in q's dtype, lse [B, H, Sq] float32, natural log; -inf for rows that see no key).
    """
    compiling = torch.compiler.is_compiling()
    args = attention_op_args(q, k, v, bias, mask, key_padding_mask, causal, window, scale, deterministic,
                             device_check=_check_device, compiling=compiling)
    with torch.no_grad():
        return _autograd.run_fwd(args, True, compiling)


def attention_backward(grad_out, q, k, v, out, lse, *, bias=None, mask=None, key_padding_mask=None, causal=False,
                       window=None, scale=None, deterministic=False, bias_requires_grad=False, grad_lse=None):
    """Backward of `attention` without autograd, for a given `out` and `lse`.

    `out`/`lse` may be those of a larger attention that these keys are one chunk of (ring attention): the
    flash-style backward then yields this chunk's share of the gradients.

    Args:
        grad_out: [B, Sq, H, D], the gradient of `out`.
        q, k, v, bias, mask, key_padding_mask, causal, window, scale, deterministic: as the forward.
        out: [B, Sq, H, D]; lse: [B, H, Sq] float32 (as `attention_forward` returns them).
        bias_requires_grad: also return dbias (needs `bias`).
        grad_lse: optional [B, H, Sq] gradient of lse.

    Shapes:
        returns (dq, dk, dv, dbias): dq/dk/dv shaped as q/k/v; dbias float32 in bias's own shape, or None.
    """
    a = OpArgs(*attention_op_args(q, k, v, bias, mask, key_padding_mask, causal, window, scale, deterministic,
                                  device_check=_check_device))
    want_dbias = check_flag(bias_requires_grad, "bias_requires_grad") and a.bias is not None
    if grad_lse is not None:
        grad_lse = torch.where(torch.isfinite(lse), grad_lse.float(), torch.zeros_like(lse)).contiguous()
    with torch.no_grad():
        dq, dk, dv, dbias, _ = ops.bwd(
            grad_out.contiguous(), a.q, a.k, a.v, out.contiguous(), lse.float().contiguous(), a.bias, a.mask,
            a.key_padding_mask, a.rel_pos_table, a.rel_pos_index, a.scale, a.causal, a.window_left,
            a.window_right, want_dbias, False, a.deterministic, grad_lse,
        )
    # float32 as documented (the op returns it in the bias's dtype)
    return dq, dk, dv, (dbias.reshape(bias.shape).float() if want_dbias else None)
