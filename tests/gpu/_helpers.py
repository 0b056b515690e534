"""Shared helpers of the CUDA-specific tests: fresh inputs, allocator poisoning, the low-precision PyTorch
comparator and the FlashAttention accuracy rule.

Accuracy rule (FlashAttention / FA3 tests): for out, dq, dk, dv

    max |kernel - ref64| <= 2 * max |naive_same_dtype - ref64| + 2 * eps(dtype) * max |ref64|

ref64 = `kernel.reference` in float64 on the same rounded inputs; naive_same_dtype = the plain PyTorch computation
(matmul, add, softmax, matmul) carried out in the input dtype, gradients by autograd in that dtype. dbias and dtable
(reductions over many scores) are checked by relative L2 error <= 1e-2 against ref64.
"""

import torch

NAN_POISON_BYTES = 1 << 30


def poison(value=float("nan")):
    """Fill the caching allocator with blocks of `value` (fp32) so unwritten outputs show up: NaN by default, a
    finite value where the expected outputs are NaN themselves (tests/gpu/test_row_policy.py)."""
    if not torch.cuda.is_available():
        return
    blocks = [torch.full((NAN_POISON_BYTES // 16 // 4,), value, device="cuda") for _ in range(16)]
    del blocks


def rand(*shape, dtype, device="cuda", scale=1.0, grad=False):
    t = (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)
    return t.requires_grad_(grad)


def qkv(B, Sq, Sk, H, D, dtype=torch.bfloat16, Hkv=None, grad=False):
    """Fresh q [B, Sq, H, D], k and v [B, Sk, Hkv, D] (Hkv defaults to H), as run_case's `inputs`."""
    Hkv = Hkv or H
    return dict(q=rand(B, Sq, H, D, dtype=dtype, grad=grad), k=rand(B, Sk, Hkv, D, dtype=dtype, grad=grad),
                v=rand(B, Sk, Hkv, D, dtype=dtype, grad=grad))


def leaf(t, dtype=None):
    if t is None:
        return None
    x = t.detach().to(dtype) if dtype is not None else t.detach().clone()
    return x.requires_grad_(t.requires_grad)


def naive_attention(reference, q, k, v, *, bias=None, mask=None, key_padding_mask=None, causal=False, window=None,
                    scale=None, rel_pos_table=None, rel_pos_index=None, swin_mask=None, swin=False):
    """Same semantics as the op, computed with plain PyTorch ops in q's dtype (the 'same dtype' comparator)."""
    dt = q.dtype
    allowed = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    if swin:
        a = reference.window_attention_args(q, k, v, rel_pos_table=rel_pos_table, rel_pos_index=rel_pos_index,
                                            bias=bias, mask=swin_mask, scale=scale, allowed_dtypes=allowed)
    else:
        a = reference.attention_args(q, k, v, bias=bias, mask=mask, key_padding_mask=key_padding_mask, causal=causal,
                                     window=window, scale=scale, allowed_dtypes=allowed)
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    qf = a.q.transpose(1, 2)
    kf = a.k.transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    vf = a.v.transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * a.scale
    if a.bias is not None:
        bb = a.bias
        if bb.shape[0] not in (1, B):
            bb = bb.repeat(B // bb.shape[0], 1, 1, 1)
        s = s + bb.to(dt)
    if a.rel_pos_table is not None:
        s = s + a.rel_pos_table.to(dt)[a.rel_pos_index].permute(2, 0, 1)
    vis = reference.visible_keys(B, Sq, Sk, q.device, a.mask, a.key_padding_mask, a.causal, a.window_left,
                                 a.window_right)
    if torch.isneginf(s).any():  # an additive -inf hides its key like a mask (rows hidden entirely output 0)
        vis = ~torch.isneginf(s) if vis is None else vis & ~torch.isneginf(s)
    if vis is not None:
        vis = vis.expand(B, H, Sq, Sk)
        any_vis = vis.any(-1, keepdim=True)
        s = s.masked_fill(~vis, float("-inf")).masked_fill(~any_vis, 0.0)
        p = torch.softmax(s, dim=-1) * any_vis.to(dt)
    else:
        p = torch.softmax(s, dim=-1)
    return (p @ vf).transpose(1, 2)


def assert_fa_close(name, got, naive, ref64, dtype):
    assert got.shape == ref64.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref64.shape)}"
    g = got.detach().double()
    assert torch.isfinite(g).all(), f"{name}: non-finite values (unwritten output?)"
    err = (g - ref64).abs().max().item()
    base = (naive.detach().double() - ref64).abs().max().item()
    # two quanta of the dtype at the result's scale (floored: some gradients are exactly 0 in exact arithmetic,
    # e.g. dq with a one-key window or dk with a single key, and then only fp32 rounding noise remains: dS = P (dP -
    # rowsum(dO O)) is a difference of two fp32 sums of D products, ~1e-6 apart at D = 64, which a 1e-3 floor
    # rejected for fp16, whose same-dtype result rounds to exactly 0)
    quanta = 2 * torch.finfo(dtype).eps * max(ref64.abs().max().item(), 1e-2)
    assert err <= 2 * base + quanta, f"{name}: max err {err:.3e} > 2 * {base:.3e} + {quanta:.3e}"
    return err, base


def _full_bias_grad(ref, t_64, kwargs, deterministic):
    """Gradient of the float64 reference w.r.t. the bias expanded to [B, H, Sq, Sk]."""
    q, k = t_64["q"], t_64["k"]
    B, Sq, H = q.shape[:3]
    full = torch.broadcast_to(t_64["bias"].detach(), (B, H, Sq, k.shape[1])).contiguous().requires_grad_(True)
    out = ref.attention(q.detach(), k.detach(), t_64["v"].detach(), bias=full, mask=t_64.get("mask"),
                        key_padding_mask=t_64.get("key_padding_mask"), **kwargs)
    out.backward(torch.randn_like(out))
    return full.grad


def assert_rel_l2(name, got, ref64, tol=1e-2, scale=None):
    g = got.detach().double()
    assert torch.isfinite(g).all(), f"{name}: non-finite values"
    if ref64.norm().item() < 1e-9 and not scale:
        # exactly zero in exact arithmetic (e.g. a one-key window: every score gradient is 0); what remains is the
        # rounding of delta = rowsum(dO * O) with O in the input dtype
        err = g.abs().max().item()
        assert err <= 1e-2, f"{name}: exact gradient is 0, got max |.| = {err:.3e}"
        return err
    # floor: some broadcast gradients are exactly 0 in exact arithmetic (one-key windows, key-constant biases)
    den = max(ref64.norm().item(), scale or 0.0, 1e-3)
    rel = (g - ref64).norm().item() / max(den, 1e-30)
    assert rel <= tol, f"{name}: relative L2 error {rel:.3e} > {tol}"
    return rel


def run_case(kernel, inputs, kwargs, *, swin=False, check_grads=True, deterministic=None):
    """Run kernel, float64 reference and the same-dtype comparator on the same inputs; check every output and
    gradient. `inputs` maps names (q, k, v, bias, rel_pos_table, ...) to tensors (requires_grad marks what is
    differentiated)."""
    ref = kernel.reference
    dtype = inputs["q"].dtype
    names = [n for n, t in inputs.items() if t is not None]
    diff = [n for n in names if inputs[n].requires_grad]

    def call(mod, tens, **extra):
        if swin:
            return mod.window_attention(tens["q"], tens["k"], tens["v"], rel_pos_table=tens.get("rel_pos_table"),
                                        rel_pos_index=tens.get("rel_pos_index"), bias=tens.get("bias"),
                                        mask=tens.get("swin_mask"), **kwargs)
        kw = dict(kwargs)
        if deterministic is not None:
            kw["deterministic"] = deterministic
        return mod.attention(tens["q"], tens["k"], tens["v"], bias=tens.get("bias"), mask=tens.get("mask"),
                             key_padding_mask=tens.get("key_padding_mask"), **kw)

    t_k = {n: leaf(t) for n, t in inputs.items() if t is not None}
    t_64 = {n: (leaf(t, torch.float64) if t.is_floating_point() else t) for n, t in inputs.items() if t is not None}
    t_lp = {n: leaf(t) for n, t in inputs.items() if t is not None}

    poison()
    out = call(kernel, t_k)
    out64 = call(ref, t_64)
    naive_kw = dict(kwargs)
    naive_kw.pop("return_lse", None)
    if swin:
        out_lp = naive_attention(ref, t_lp["q"], t_lp["k"], t_lp["v"], bias=t_lp.get("bias"),
                                 rel_pos_table=t_lp.get("rel_pos_table"), rel_pos_index=t_lp.get("rel_pos_index"),
                                 swin_mask=t_lp.get("swin_mask"), swin=True, **naive_kw)
    else:
        out_lp = naive_attention(ref, t_lp["q"], t_lp["k"], t_lp["v"], bias=t_lp.get("bias"), mask=t_lp.get("mask"),
                                 key_padding_mask=t_lp.get("key_padding_mask"), **naive_kw)
    report = {"out": assert_fa_close("out", out, out_lp, out64, dtype)}
    if not check_grads or not diff:
        return report
    dout = torch.randn_like(out64).to(dtype)
    poison()
    out.backward(dout)
    out64.backward(dout.double())
    out_lp.backward(dout)
    for n in diff:
        g = t_k[n].grad
        assert g is not None, f"no gradient for {n}"
        if n in ("q", "k", "v"):
            report["d" + n] = assert_fa_close("d" + n, g, t_lp[n].grad, t_64[n].grad, dtype)
        elif n == "bias" and not swin and inputs["bias"].shape[-1] == 1 and inputs["k"].shape[1] > 1:
            # A bias constant along the keys has an exactly zero gradient (softmax is shift invariant): what the
            # kernel returns is rounding noise, judged against the size of the un-broadcast score gradient.
            full = _full_bias_grad(ref, t_64, kwargs, deterministic)
            report["d" + n] = assert_rel_l2("d" + n, g, t_64[n].grad, scale=full.norm().item())
        else:
            report["d" + n] = assert_rel_l2("d" + n, g, t_64[n].grad)
    return report


def kernels_run(fn):
    """The names of the CUDA kernels fn() launched (torch profiler): which kernel the planner really ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
