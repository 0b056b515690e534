"""Autograd of the `fwd` op, and the eager route into the op that skips torch.library's Python autograd kernel.

Why two routes: `torch.library.register_autograd` registers a Python kernel for the op's Autograd key, so every
call through the dispatcher goes C++ -> Python -> C++: about 6 us per call without gradients, and about 60 us
with them (most of it `torch._library.utils.fill_defaults` rebuilding the 13-argument schema on every call), for
a kernel that takes ~15 us on one 7x7 window. That route stays for direct `torch.ops` callers, tensor subclasses,
functorch transforms and torch.compile (AOTAutograd traces the registered formula). Eager calls of the public API
take `run_fwd` instead: straight into the kernel below the autograd keys when no gradient is needed (what
torch.library's no-grad branch does, minus the Python hop), and one `FwdFunction` node when one is. Both routes
share `setup_context` and `grads`, so their gradients are the same numbers.
"""

import torch
from torch.overrides import has_torch_function

from ._ops import ops

# The op's C++ entry (OpOverload._op): OpOverload.__call__ is a Python frame that only forwards to it (~0.3 us of a
# ~20 us call on one 7x7 window). Where a torch version lacks the attribute, the overload itself.
_fwd = getattr(ops.fwd.default, "_op", ops.fwd.default)
_bwd = getattr(ops.bwd.default, "_op", ops.bwd.default)  # (the same for the backward, which every route shares)
_below_autograd = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad
_functorch_active = torch._C._are_functorch_transforms_active


def setup_context(ctx, inputs, output):
    """The registered formula's context. FwdFunction.forward saves the same state inline (one Python call less per
    eager call): keep the two in step (test_host_path.py compares the gradients of both routes)."""
    q, k, v, bias, mask, kpm, table, index, scale, causal, left, right, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, bias, mask, kpm, table, index)
    ctx.options = (scale, causal, left, right, deterministic)
    # An unused output's gradient arrives as None instead of a zero tensor: lse is rarely differentiated, and its
    # materialized zeros cost seven small kernels (fill, isfinite, where) per backward for nothing.
    ctx.set_materialize_grads(False)


def grads(ctx, grad_out, grad_lse, bias_grad, table_grad):
    """(dq, dk, dv, dbias or None, dtable or None) for the context saved by `setup_context`."""
    q, k, v, out, lse, bias, mask, kpm, table, index = ctx.saved_tensors
    scale, causal, left, right, deterministic = ctx.options
    bias_grad = bias_grad and bias is not None
    table_grad = table_grad and table is not None
    if grad_out is None:  # only lse was differentiated
        grad_out = torch.zeros_like(out)
    if grad_lse is not None:
        # Enters through delta (see BwdParams::dlse). Rows with lse = -inf have P = 0: zero their gradient so a NaN
        # coming from -inf arithmetic downstream cannot leak into dS.
        grad_lse = torch.where(torch.isfinite(lse), grad_lse.float(), torch.zeros_like(lse)).contiguous()
    dq, dk, dv, dbias, dtable = _bwd(
        grad_out.contiguous(), q, k, v, out, lse, bias, mask, kpm, table, index, scale, causal, left, right,
        bias_grad, table_grad, deterministic, grad_lse,
    )
    # in the saved inputs' own dtypes (the kernels accumulate in fp32)
    dbias = dbias.to(bias.dtype) if bias_grad else None
    dtable = dtable.to(table.dtype) if table_grad else None
    return dq, dk, dv, dbias, dtable


def backward(ctx, grad_out, grad_lse):
    """The formula registered on the op (inputs in schema order: bias is input 3, rel_pos_table input 6)."""
    dq, dk, dv, dbias, dtable = grads(ctx, grad_out, grad_lse, ctx.needs_input_grad[3], ctx.needs_input_grad[6])
    return dq, dk, dv, dbias, None, None, dtable, None, None, None, None, None, None


class FwdFunction(torch.autograd.Function):
    """The op as one autograd node for eager calls: inputs (q, k, v, bias, rel_pos_table, args, want_lse), where
    `args` is the op's whole argument tuple in schema order (its tensors after the first five never get a gradient:
    bool masks, the integer index; autograd does not look inside a tuple), passed as it is rather than rebuilt per
    call. q, k, v, bias and the table are taken from the node's own inputs (dead functorch wrappers unwrapped).
    Returns out, or (out, lse) with want_lse."""

    @staticmethod
    def forward(ctx, q, k, v, bias, table, args, want_lse):
        mask, kpm, index = args[4], args[5], args[7]
        with _below_autograd():  # forward runs with grad mode off: skip the registered Python autograd kernel
            out, lse = _fwd(q, k, v, bias, mask, kpm, table, index, *args[8:])
        # = setup_context(ctx, inputs, (out, lse)), inline
        ctx.save_for_backward(q, k, v, out, lse, bias, mask, kpm, table, index)
        ctx.options = args[8:]  # (scale, causal, left, right, deterministic)
        ctx.set_materialize_grads(False)
        return (out, lse) if want_lse else out

    @staticmethod
    def backward(ctx, grad_out, grad_lse=None):
        dq, dk, dv, dbias, dtable = grads(ctx, grad_out, grad_lse, ctx.needs_input_grad[3], ctx.needs_input_grad[4])
        return dq, dk, dv, dbias, dtable, None, None


# Function.apply minus its Python prologue (~2 us of a ~35 us call): with no functorch transform active and no
# setup_context staticmethod, `Function.apply` only unwraps dead functorch wrappers (done here for the tensor inputs)
# and calls this C apply. Where a torch version lacks it, the public apply is used.
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
try:
    _c_apply = super(torch.autograd.Function, FwdFunction).apply
except AttributeError:  # pragma: no cover - depends on the torch version
    _c_apply = None
if _c_apply is None or _unwrap_if_dead is None:  # pragma: no cover
    _c_apply, _unwrap_if_dead = FwdFunction.apply, lambda t: t


def run_fwd(args: tuple, want_lse: bool, compiling: bool):
    """(out, lse) of `fwd(*args)` (args in schema order, already validated) with autograd; lse is None when
    want_lse is False and a graph is recorded. `compiling`: torch.compiler.is_compiling(), read once by the caller."""
    # (the arguments after the tensors are Python scalars, which has_torch_function skips)
    if compiling or _functorch_active() or has_torch_function(args):
        return ops.fwd(*args)  # through the dispatcher and the registered formula (traced / subclass / functorch)
    q, k, v, bias, table = args[0], args[1], args[2], args[3], args[6]
    if torch.is_grad_enabled() and _any_requires_grad(q, k, v, bias, table):
        u = _unwrap_if_dead
        bias = None if bias is None else u(bias)
        table = None if table is None else u(table)
        if want_lse:
            return _c_apply(u(q), u(k), u(v), bias, table, args, True)
        return _c_apply(u(q), u(k), u(v), bias, table, args, False), None
    with _below_autograd():
        return _fwd(*args)
