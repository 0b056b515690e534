"""Argument checking and normalization shared by the compiled kernels and the reference.

Every public call is turned into the op-level arguments of `fwd` (see torch-ext/torch_binding.cpp and
kernel-src/winattn_params.h): bias and bool mask become 4-D *views* [P, Hb, Rq, Rk] (P = 1, B or the Swin window
count), nothing is expanded. Bad input raises ValueError naming the argument, what was expected and what came.
"""

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ._index_bounds import check_rel_pos_index

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
_FLOAT32_MAX = torch.finfo(torch.float32).max  # (float32's largest finite value; rounding up from it gives inf)


@dataclass
class OpArgs:
    """Positional arguments of the `fwd` op, in schema order."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]
    key_padding_mask: Optional[torch.Tensor]
    rel_pos_table: Optional[torch.Tensor]
    rel_pos_index: Optional[torch.Tensor]
    scale: float
    causal: bool
    window_left: int
    window_right: int
    deterministic: bool

    def as_tuple(self) -> tuple:
        return (
            self.q, self.k, self.v, self.bias, self.mask, self.key_padding_mask, self.rel_pos_table,
            self.rel_pos_index, self.scale, self.causal, self.window_left, self.window_right, self.deterministic,
        )


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed_dtypes=_KERNEL_DTYPES) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, S, H, D], got shape {tuple(t.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in allowed_dtypes:
        raise ValueError(f"q/k/v dtype must be one of {[str(d) for d in allowed_dtypes]}, got {q.dtype}")
    B, Sq, H, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v sequence lengths differ: {k.shape[1]} vs {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v head counts differ: {k.shape[2]} vs {v.shape[2]}")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"head dims differ: q {D}, k {k.shape[3]}, v {v.shape[3]}")
    if D % 8 != 0 or D < 8 or D > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be a multiple of 8 in [8, {MAX_HEAD_DIM}], got {D}")
    if k.shape[2] < 1:
        raise ValueError(f"k and v need at least one head (H_kv >= 1), got shape {tuple(k.shape)}")
    if H % k.shape[2] != 0:
        raise ValueError(f"num_heads of q ({H}) must be a multiple of the k/v head count ({k.shape[2]}) (GQA/MQA)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride(-1) == 1), got strides {t.stride()}")


def _broadcast_view(t: torch.Tensor, name: str, B: int, H: int, Sq: int, Sk: int) -> torch.Tensor:
    """Right-aligned torch broadcasting of `t` to [B, H, Sq, Sk], returned as a 4-D view (no copy)."""
    if t.dim() > 4:
        raise ValueError(f"{name} must have at most 4 dims to broadcast to [B, H, Sq, Sk], got {tuple(t.shape)}")
    view = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t
    for have, want, dim in zip(view.shape, (B, H, Sq, Sk), ("B", "H", "Sq", "Sk")):
        if have not in (1, want):
            raise ValueError(
                f"{name} of shape {tuple(t.shape)} does not broadcast to [B, H, Sq, Sk] = "
                f"[{B}, {H}, {Sq}, {Sk}] (dim {dim}: {have} vs {want})"
            )
    return view


def _check_same_device(t: torch.Tensor, name: str, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")


def check_flag(value, name: str) -> bool:
    """`value` when it is a real bool. A truthy string (causal="no") or a number used to be taken as True; SDPA's
    `is_causal` takes only a bool too (TypeError)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")
    return value


def _window_side(value, name: str, window) -> int:
    if value is None:
        return -1
    # bool is an int subclass and float/str convert with int(): all three used to be taken silently (a float
    # truncated), so only true integers (int, NumPy / 0-d torch integers via __index__) are accepted.
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"window {name} side must be an int (or None / -1 for unbounded), got "
                        f"{type(value).__name__} {value!r} in window={window!r}") from None


def _window(window, seqlen_q: int, seqlen_k: int) -> Tuple[int, int]:
    """(left, right) as op arguments: -1 = unbounded, else clamped to Sq + Sk.

    The key offset d = j - i - (Sk - Sq) of any (query, key) pair lies in [-(Sk - 1), Sq - 1], so a side of
    Sq + Sk or more is unbounded in effect; clamping keeps the kernels' band arithmetic (i + offset + side, in
    int64) from overflowing for sides near INT64_MAX.
    """
    if window is None:
        return -1, -1
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be a (left, right) pair, got {window!r}") from None
    left = _window_side(left, "left", window)
    right = _window_side(right, "right", window)
    if left < -1 or right < -1:
        raise ValueError(f"window sizes must be >= 0 (or -1/None for unbounded), got {window!r}")
    cap = seqlen_q + seqlen_k
    return min(left, cap), min(right, cap)


# ---- Validation, cached per call signature --------------------------------------------------------------------
# Why: for a small call (one 7x7 window) the Python checks cost as much as the kernel. Every check below reads only
# metadata (types, shapes, strides, dtypes, devices, the scale and window values), so its outcome is a pure function
# of a key made of exactly that metadata: a key seen before passed every check and maps to the derived plan
# (scale, window sides, reshape / cast decisions). Checks that depend on values or tensor identity are not cached
# here: the rel_pos_index range goes through check_rel_pos_index on every call (its own identity + version cache).
# Uncacheable arguments (a window given as a list or 0-d tensor, a tensor scale, SymInt shapes while tracing)
# take the uncached path, which runs the same checks.

_MAX_PLANS = 1024  # distinct call signatures kept; the dict is cleared past it (dynamic shapes must not grow it)
_plans: dict = {}


def _cached(key):
    """The plan cached under `key`, or None: no key, not seen yet, or unhashable (SymInt shapes of fake tensors
    traced with dynamic shapes outside torch.compile)."""
    if key is None:
        return None
    try:
        return _plans.get(key)
    except TypeError:
        return None


def _remember(key, plan):
    if key is None:
        return
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    try:
        _plans[key] = plan
    except TypeError:
        pass


def _cacheable(scale, compiling) -> bool:
    """A scale hashed by value (not a 0-d tensor, hashed by identity), outside torch.compile tracing (fake tensors,
    and a global dict that the traced function must not mutate)."""
    return (scale is None or type(scale) is float or type(scale) is int) and not compiling


def _attention_key(q, k, v, bias, mask, key_padding_mask, window, scale, allowed_dtypes, device_check, compiling):
    if not _cacheable(scale, compiling):
        return None
    if window is not None and not (
        type(window) is tuple and len(window) == 2
        and (window[0] is None or type(window[0]) is int) and (window[1] is None or type(window[1]) is int)
    ):
        return None
    try:
        key = (
            device_check, allowed_dtypes, window, scale,
            type(q), q.shape, q.stride(), q.dtype, q.device,
            type(k), k.shape, k.stride(), k.dtype, k.device,
            type(v), v.shape, v.stride(), v.dtype, v.device,
            None if bias is None else (type(bias), bias.shape, bias.dtype, bias.device),
            None if mask is None else (type(mask), mask.shape, mask.dtype, mask.device),
            None if key_padding_mask is None else (type(key_padding_mask), key_padding_mask.shape,
                                                   key_padding_mask.dtype, key_padding_mask.device),
        )
    except AttributeError:  # not a tensor: the checks say so
        return None
    return key


def _check_attention(q, k, v, bias, mask, key_padding_mask, window, scale, allowed_dtypes, device_check):
    """All checks of `attention`; returns the plan (scale, left, right, bias_shape4, bias_cast, mask_shape4)."""
    _check_qkv(q, k, v, allowed_dtypes)
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    bias_shape = bias_cast = mask_shape = None
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise ValueError(f"bias must be a floating-point tensor, got {getattr(bias, 'dtype', type(bias))}")
        _check_same_device(bias, "bias", q.device)
        view = _broadcast_view(bias, "bias", B, H, Sq, Sk)
        bias_shape = None if view is bias else tuple(view.shape)
        bias_cast = None if bias.dtype in (q.dtype, torch.float32) else q.dtype
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a bool tensor (True = attend), got {getattr(mask, 'dtype', type(mask))}; "
                "pass additive float masks as bias="
            )
        _check_same_device(mask, "mask", q.device)
        view = _broadcast_view(mask, "mask", B, H, Sq, Sk)
        mask_shape = None if view is mask else tuple(view.shape)
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            raise ValueError("key_padding_mask must be a bool tensor [B, Sk] (True = real token)")
        _check_same_device(key_padding_mask, "key_padding_mask", q.device)
        if tuple(key_padding_mask.shape) != (B, Sk):
            raise ValueError(f"key_padding_mask must be [B, Sk] = [{B}, {Sk}], got {tuple(key_padding_mask.shape)}")
    left, right = _window(window, Sq, Sk)
    scale = _scale(scale, D)
    if device_check is not None:
        device_check(q)
    return scale, left, right, bias_shape, bias_cast, mask_shape


def attention_op_args(
    q, k, v, bias=None, mask=None, key_padding_mask=None, causal=False, window=None, scale=None,
    deterministic=False, allowed_dtypes=_KERNEL_DTYPES, device_check=None, compiling=None,
) -> tuple:
    """`fwd`'s positional arguments (schema order) for an `attention` call; raises on bad input.

    device_check(q), if given, is the build's own device / dtype check (run with the others; cached with them).
    compiling: torch.compiler.is_compiling() if the caller has read it already (None: read here).
    """
    check_flag(causal, "causal")
    check_flag(deterministic, "deterministic")
    if compiling is None:
        compiling = torch.compiler.is_compiling()
    key = _attention_key(q, k, v, bias, mask, key_padding_mask, window, scale, allowed_dtypes, device_check,
                         compiling)
    plan = _cached(key)
    if plan is None:
        plan = _check_attention(q, k, v, bias, mask, key_padding_mask, window, scale, allowed_dtypes, device_check)
        _remember(key, plan)
    scale, left, right, bias_shape, bias_cast, mask_shape = plan
    if bias_shape is not None:
        bias = bias.reshape(bias_shape)
    if bias_cast is not None:
        bias = bias.to(bias_cast)
    if mask_shape is not None:
        mask = mask.reshape(mask_shape)
    return (q, k, v, bias, mask, key_padding_mask, None, None, scale, causal, left, right, deterministic)


def attention_args(
    q, k, v, *, bias=None, mask=None, key_padding_mask=None, causal=False, window=None, scale=None,
    deterministic=False, allowed_dtypes=_KERNEL_DTYPES,
) -> OpArgs:
    return OpArgs(*attention_op_args(q, k, v, bias, mask, key_padding_mask, causal, window, scale, deterministic,
                                     allowed_dtypes))


def _window_key(q, k, v, rel_pos_table, rel_pos_index, bias, mask, scale, allowed_dtypes, device_check, compiling):
    if not _cacheable(scale, compiling):
        return None
    try:
        key = (
            device_check, allowed_dtypes, scale,
            type(q), q.shape, q.stride(), q.dtype, q.device,
            type(k), k.shape, k.stride(), k.dtype, k.device,
            type(v), v.shape, v.stride(), v.dtype, v.device,
            None if rel_pos_table is None else (type(rel_pos_table), rel_pos_table.shape, rel_pos_table.dtype,
                                                rel_pos_table.device),
            None if rel_pos_index is None else (type(rel_pos_index), rel_pos_index.shape, rel_pos_index.dtype,
                                                rel_pos_index.device),
            None if bias is None else (type(bias), bias.shape, bias.dtype, bias.device),
            None if mask is None else (type(mask), mask.shape, mask.dtype, mask.device),
        )
    except AttributeError:
        return None
    return key


def _check_window(q, k, v, rel_pos_table, rel_pos_index, bias, mask, scale, allowed_dtypes, device_check):
    """All metadata checks of `window_attention`; returns the plan
    (scale, table_rows, cast_table, cast_index, index_shape, bias_shape4, mask_repeat, additive_cast)."""
    _check_qkv(q, k, v, allowed_dtypes)
    BW, N, H, D = q.shape
    if k.shape[1] != N:
        raise ValueError(f"window attention needs equal q and k lengths (the window area N), got {N} and {k.shape[1]}")
    if (rel_pos_table is None) != (rel_pos_index is None):
        raise ValueError("rel_pos_table and rel_pos_index must be given together")
    rows = index_shape = None
    cast_table = cast_index = False
    if rel_pos_table is not None:
        _check_same_device(rel_pos_table, "rel_pos_table", q.device)
        _check_same_device(rel_pos_index, "rel_pos_index", q.device)
        # Any row count T: (2W-1)^2 for Swin, (2W-1)^2 + 3 for BEiT's class-token entries; the index range is what
        # check_rel_pos_index verifies against it.
        if rel_pos_table.dim() != 2 or rel_pos_table.shape[1] != H or not rel_pos_table.is_floating_point():
            raise ValueError(f"rel_pos_table must be a float [T, num_heads={H}] tensor (T rows, e.g. (2W-1)^2), got "
                             f"{tuple(rel_pos_table.shape)} {rel_pos_table.dtype}")
        # [N, N], or flat [N * N] as timm's RelPosBias keeps it: viewed as [N, N] after the range check, so that the
        # range cache of _index_bounds sees the caller's own (module buffer) tensor on every call.
        if (tuple(rel_pos_index.shape) not in ((N, N), (N * N,)) or rel_pos_index.is_floating_point()
                or rel_pos_index.dtype == torch.bool):
            raise ValueError(f"rel_pos_index must be an integer [N, N] = [{N}, {N}] tensor (or flat [N * N] = "
                             f"[{N * N}]), got {tuple(rel_pos_index.shape)} {rel_pos_index.dtype}")
        if rel_pos_index.dim() == 1:
            index_shape = (N, N)
        rows = rel_pos_table.shape[0]
        # float32 table (Swin keeps it fp32 under AMP) and int64 index at the op level: both are tiny.
        cast_table = rel_pos_table.dtype != torch.float32
        cast_index = rel_pos_index.dtype != torch.int64
    additive_dtype = None
    bias_shape = mask_repeat = None
    nw = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or not mask.is_floating_point() or mask.dim() != 3 or mask.shape[1:] != (N, N):
            raise ValueError(f"mask must be an additive float [nW, N, N] tensor (Swin shift mask), got "
                             f"{tuple(getattr(mask, 'shape', ()))} {getattr(mask, 'dtype', type(mask))}")
        _check_same_device(mask, "mask", q.device)
        nw = mask.shape[0]
        if nw < 1 or BW % nw != 0:
            raise ValueError(f"the window count of mask ({nw}) must divide the batch dim of q ({BW} = B * nW)")
        additive_dtype = mask.dtype
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise ValueError("bias must be a floating-point tensor")
        _check_same_device(bias, "bias", q.device)
        view = _broadcast_view(bias, "bias", BW, H, N, N)
        bias_shape = None if view is bias else tuple(view.shape)
        if nw is not None and view.shape[0] not in (1, nw):
            mask_repeat = view.shape[0] // nw
        additive_dtype = bias.dtype  # bias + mask.to(bias.dtype), or the bias alone
    additive_cast = None
    if additive_dtype is not None and additive_dtype not in (q.dtype, torch.float32):
        additive_cast = q.dtype
    scale = _scale(scale, D)
    if device_check is not None:
        device_check(q)
    return scale, rows, cast_table, cast_index, index_shape, bias_shape, mask_repeat, additive_cast


def window_attention_op_args(
    q, k, v, rel_pos_table=None, rel_pos_index=None, bias=None, mask=None, scale=None, deterministic=False,
    allowed_dtypes=_KERNEL_DTYPES, device_check=None, compiling=None, op_checks_index=False,
) -> tuple:
    """`fwd`'s positional arguments (schema order) for a `window_attention` call; raises on bad input.

    Metadata checks are cached (see above); the rel_pos_index range is checked on every call, before any kernel
    runs, by check_rel_pos_index (skipped while torch.compile traces: interface.py puts it in the graph instead).
    op_checks_index: the caller's op checks the range itself on every call (the CPU op), and the caller turns the
    op's error into check_rel_pos_index's IndexError (interface.window_attention); the check is skipped here.
    """
    check_flag(deterministic, "deterministic")
    if compiling is None:
        compiling = torch.compiler.is_compiling()
    key = _window_key(q, k, v, rel_pos_table, rel_pos_index, bias, mask, scale, allowed_dtypes, device_check,
                      compiling)
    plan = _cached(key)
    if plan is None:
        plan = _check_window(q, k, v, rel_pos_table, rel_pos_index, bias, mask, scale, allowed_dtypes, device_check)
        _remember(key, plan)
    scale, rows, cast_table, cast_index, index_shape, bias_shape, mask_repeat, additive_cast = plan
    if rows is not None:
        # Before .long() and the [N, N] view: the caller's own tensor is the one whose range is cached (an int32 or
        # flat index would otherwise be a new tensor every call).
        if not compiling and not op_checks_index:
            check_rel_pos_index(rel_pos_index, rows)
        if cast_table:
            rel_pos_table = rel_pos_table.float()
        if cast_index:
            rel_pos_index = rel_pos_index.long()
        if index_shape is not None:
            rel_pos_index = rel_pos_index.reshape(index_shape)
    additive = None
    if mask is not None:
        additive = mask.unsqueeze(1)  # [nW, 1, N, N]: window index = batch index mod nW
    if bias is not None:
        if bias_shape is not None:
            bias = bias.reshape(bias_shape)
        if additive is not None:
            # Both present: sum them (size nW*H*N^2 or B*nW*H*N^2, bounded by the bias itself); autograd reduces
            # the gradient back to bias's shape.
            if mask_repeat is not None:
                additive = additive.repeat(mask_repeat, 1, 1, 1)
            additive = bias + additive.to(bias.dtype)
        else:
            additive = bias
    if additive_cast is not None:
        additive = additive.to(additive_cast)
    return (q, k, v, additive, None, None, rel_pos_table, rel_pos_index, scale, False, -1, -1, deterministic)


def window_attention_args(
    q, k, v, *, rel_pos_table=None, rel_pos_index=None, bias=None, mask=None, scale=None, deterministic=False,
    allowed_dtypes=_KERNEL_DTYPES,
) -> OpArgs:
    return OpArgs(*window_attention_op_args(q, k, v, rel_pos_table, rel_pos_index, bias, mask, scale, deterministic,
                                            allowed_dtypes))


def _scale(scale, head_dim: int) -> float:
    """The softmax scale: None (1/sqrt(D)), a real number or a one-element real tensor; TypeError for anything else
    (a string such as "0.5" used to be converted; SDPA refuses it), ValueError when not finite."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    real = isinstance(scale, (numbers.Real, torch.SymInt, torch.SymFloat)) and not isinstance(scale, bool)
    if isinstance(scale, torch.Tensor):
        real = scale.numel() == 1 and not scale.dtype.is_complex and scale.dtype != torch.bool
    if not real:
        raise TypeError(f"scale must be a real number (float or int) or a one-element real tensor, got "
                        f"{type(scale).__name__} {scale!r}")
    scale = float(scale)
    # The kernels take the scale as a float32: a double past float32's range (|scale| > 3.4e38, e.g. 1e39) passed
    # the finite check and became +-inf in the op, so every output was NaN with no error.
    if not math.isfinite(scale) or abs(scale) > _FLOAT32_MAX:
        raise ValueError(f"scale must be finite in float32 (|scale| <= {_FLOAT32_MAX:.7g}), got {scale}")
    return scale
