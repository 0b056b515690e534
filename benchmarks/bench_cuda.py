"""H200 benchmark of the window-attention CUDA kernels against the peers, all measured in the same run.

    python benchmarks/bench_cuda.py --variant build/torch-stable-abi210-cu130-x86_64-linux [--out results/bench_cuda.json]

Workloads (bf16): Swin W7 / W8 (16384 windows, H=4, N=49 / 64, D=32, table + shift mask), Swin W12 (8192
windows, N=144), Swin W16 (4096 windows, N=256), dense bias [1,H,S,S] (B=2, H=16, S=4096, D=64), no bias S=16k
(B=1) at D=64 / 128 (H=16) and D=256 (H=8), causal S=16k D=128, key-padding mask at S=4096, D=128 (B=4, H=16)
against the same call without it; T5-style bias [1,H,S,S] (B=8, S=1024, H=16, D=64, with its gradient), Flux
(S=4608, H=24, D=128) and QwenImage key padding (B=2, S=4352, H=24, D=128).
Peers: SDPA-efficient with the bias materialized (gradient on the bias / table), cuDNN SDPA with bias (no bias
gradient: its backward is run without one), FlexAttention score_mod (torch.compile'd), SDPA without bias,
FlashAttention-4 (`fa4`) on the calls without a term (no bias / causal / Flux; staged by
../shared/device/fa4_wheels.sh, else its rows say why it did not run); and
`ours_v1`: our kernel with the Hopper kernels disabled (WINATTN_FORCE_KERNEL=v1), i.e. v1.1, in the same run;
`ours_bwd_v1`: only the backward v3 disabled (WINATTN_FORCE_KERNEL=bwd_v1).
Timing: CUDA events around each call after warm-up, repetitions queued back to back, median of --reps; backward
timed alone (retain_graph).
Prints a table last and writes every number to --out (JSON).
--profile: no timing; each of our calls runs once (forward + backward) inside a CUDA profiler range after warm-up,
for `ncu --profile-from-start off` (see RESULTS.md for the command).
"""

import argparse
import json
import os
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BF16 = torch.bfloat16
SKIP_PEERS = False  # --skip-peers: only our kernel (profiling / tuning runs)
SWEEP_G = []  # --sweep-g: also time our Swin kernels at these windows-per-CTA counts
PROFILE = False  # --profile: one forward + backward of ours per workload inside a profiler range, no timing
HOST_MS = []  # host ms per call of each cuda_time() (diagnostic: reported as fwd_host_ms / bwd_host_ms)


def load_kernel(variant):
    from kernels import get_local_kernel

    return get_local_kernel(Path(variant))


def cuda_time(fn, reps, warmup=3):
    """Median ms of fn() between device events. The repetitions are queued back to back (no host sync between
    them), so the host's launch overhead overlaps the previous repetition's kernels instead of adding to the
    measured time; when the host is the slower side, the gaps still show up in the events. (The v1 / v1.1 rows
    of RESULTS.md synchronized after every repetition and include ~0.05-0.1 ms of launch overhead per call.)"""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    t0 = time.perf_counter()
    for a, b in events:
        a.record()
        fn()
        b.record()
    host_ms = (time.perf_counter() - t0) * 1e3 / reps  # host time per call; ~= the device time: host-bound
    torch.cuda.synchronize()
    HOST_MS.append(host_ms)
    return statistics.median(a.elapsed_time(b) for a, b in events)


def device_ms(step, reps):
    """(kernel ms per call, [(kernel name, ms per call)] longest first) of `reps` calls of step(): the device time of
    every kernel (and memset / memcpy) the calls launched, from torch.profiler (CUPTI), whatever the host's pace."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    per_kernel = {}
    for e in prof.key_averages():
        us = e.self_device_time_total
        if us > 0:
            per_kernel[e.key] = per_kernel.get(e.key, 0.0) + us / 1e3 / reps
    return sum(per_kernel.values()), sorted(per_kernel.items(), key=lambda kv: -kv[1])


# FlashAttention-4 (flash-attn-4's CuTe DSL kernels, sm90 path on the H200): the best peer for plain attention (issue
# 30). The H200 has no network: ../shared/device/fa4_wheels.sh stages its wheels into FA4_SITE over two calls.
FA4_SITE = "/tmp/fa4/site"
_FA4 = {}


def fa4_import():
    """(flash_attn.cute.flash_attn_func, None) after site.addsitedir(FA4_SITE), or (None, why it is not there); tried
    once per process. FA4 is an optional peer: where it is missing its rows say why."""
    if "fn" not in _FA4:
        import site

        site.addsitedir(FA4_SITE)
        try:
            from flash_attn.cute import flash_attn_func

            _FA4["fn"], _FA4["why"] = flash_attn_func, None
        except Exception as e:
            first = str(e).splitlines()[0][:160] if str(e) else ""
            _FA4["fn"], _FA4["why"] = None, (f"not importable after site.addsitedir({FA4_SITE!r}): "
                                             f"{type(e).__name__}: {first}")
    return _FA4["fn"], _FA4["why"]


def fa4_attention(q, k, v, **kw):
    """FA4's output for q / k / v [B, S, H, D] (some versions return (out, lse)); RuntimeError saying why when FA4 is
    not there, which the peer's row records."""
    fn, why = fa4_import()
    if fn is None:
        raise RuntimeError(f"FA4 {why}")
    r = fn(q, k, v, **kw)
    return r[0] if isinstance(r, tuple) else r


def warm_up_gpu(seconds=1.0):
    """Busy the GPU before the first timing: an idle H200 reports ~345 MHz and ramps its clocks up over the first
    few hundred ms of work, which made the first workload (Swin W7 forward) read 0.344-0.376 ms across runs."""
    a = torch.randn(4096, 4096, device="cuda", dtype=BF16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def measure(fwd, grads_of, reps):
    """fwd() -> output; grads_of(out, dout) -> grads. Returns fwd ms, bwd ms, peak extra MB (fwd+bwd)."""
    torch.cuda.synchronize()
    out = fwd()
    dout = torch.randn_like(out)
    grads_of(out, dout)
    del out
    if PROFILE:
        grads_of(fwd(), dout)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        grads_of(fwd(), dout)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        HOST_MS[:] = [math.nan, math.nan]
        return math.nan, math.nan, math.nan
    t_f = cuda_time(lambda: fwd(), reps)
    holder = {}

    def make():
        holder["out"] = fwd()

    make()
    t_b = cuda_time(lambda: grads_of(holder["out"], dout), reps)
    del holder["out"]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    o = fwd()
    grads_of(o, dout)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    del o
    return t_f, t_b, peak


def autograd_grads(leaves):
    def g(out, dout):
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)

    return g


def run_v1(fn, results, key, reps):
    """Our kernel again with the Hopper (sm90) kernels disabled: v1 (v1.1 backward), same binary, same run."""
    os.environ["WINATTN_FORCE_KERNEL"] = "v1"
    try:
        run_peer("ours_v1", fn, results, key, reps)
    finally:
        del os.environ["WINATTN_FORCE_KERNEL"]


def run_peer(name, fn, results, key, reps):
    try:
        HOST_MS.clear()
        t_f, t_b, mem = fn(reps)
        results[key][name] = {"fwd_ms": t_f, "bwd_ms": t_b, "fb_ms": t_f + t_b, "peak_mb": mem,
                              "fwd_host_ms": HOST_MS[0], "bwd_host_ms": HOST_MS[1]}
    except Exception as e:  # a peer that cannot run this shape is reported, not fatal
        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        results[key][name] = {"error": msg}
        print(f"  [{key}] {name}: {msg}", file=sys.stderr)
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------------------------
def swin_setup(win, nwin, H=4, D=32, nW=64):
    N = win * win
    q, k, v = (torch.randn(nwin, N, H, D, device="cuda", dtype=BF16).requires_grad_(True) for _ in range(3))
    coords = torch.stack(torch.meshgrid(torch.arange(win), torch.arange(win), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (win - 1)
    index = (rel[..., 0] * (2 * win - 1) + rel[..., 1]).cuda()
    table = (torch.randn((2 * win - 1) ** 2, H, device="cuda") * 0.02).requires_grad_(True)
    region = torch.randint(0, 4, (nW, N), device="cuda")
    mask = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)
    return q, k, v, table, index, mask


def bench_swin(kern, win, nwin, reps, results):
    key = f"swin_w{win}"
    results[key] = {}
    q, k, v, table, index, mask = swin_setup(win, nwin)
    Bw, N, H, D = q.shape
    nW = mask.shape[0]
    results[key]["shape"] = dict(windows=Bw, N=N, H=H, D=D, nW=nW, dtype="bf16")
    io_f = 4 * Bw * N * H * D * 2
    io_b = 8 * Bw * N * H * D * 2
    results[key]["io_bytes"] = {"fwd": io_f, "bwd": io_b}

    def ours(reps):
        f = lambda: kern.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask)
        return measure(f, autograd_grads([q, k, v, table]), reps)

    def bias_full():  # (RPB gather + shift mask) materialized as [Bw, H, N, N], as SDPA needs it
        rpb = table[index].permute(2, 0, 1)  # [H, N, N]
        b = rpb[None] + mask.repeat(Bw // nW, 1, 1)[:, None]
        return b.to(BF16).contiguous()

    def sdpa(backend, with_bias=True, bias_grad=True):
        def run(reps):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            leaves = [q, k, v] + ([table] if (with_bias and bias_grad) else [])

            def f():
                b = bias_full() if with_bias else None
                if b is not None and not bias_grad:
                    b = b.detach()
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=b)

            return measure(f, autograd_grads(leaves), reps)

        return run

    def flex(reps):
        from torch.nn.attention.flex_attention import flex_attention

        fa = torch.compile(flex_attention, dynamic=False)
        idx32 = index
        nw = nW

        def score_mod(score, b, h, i, j):
            return score + table[idx32[i, j], h] + mask[b % nw, i, j]

        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        f = lambda: fa(qt, kt, vt, score_mod=score_mod)
        return measure(f, autograd_grads([q, k, v, table]), reps)

    run_peer("ours", ours, results, key, reps)
    run_v1(ours, results, key, reps)
    for g in SWEEP_G:
        os.environ["WINATTN_FWD_G"] = os.environ["WINATTN_BWD_G"] = str(g)
        run_peer(f"ours_G{g}", ours, results, key, reps)
        del os.environ["WINATTN_FWD_G"], os.environ["WINATTN_BWD_G"]
    if not SKIP_PEERS:
        run_peer("sdpa_eff_bias", sdpa(SDPBackend.EFFICIENT_ATTENTION), results, key, reps)
        run_peer("cudnn_bias_nograd", sdpa(SDPBackend.CUDNN_ATTENTION, bias_grad=False), results, key, reps)
        run_peer("flex_score_mod", flex, results, key, reps)
        run_peer("sdpa_eff_nobias", sdpa(SDPBackend.EFFICIENT_ATTENTION, with_bias=False), results, key, reps)
    del q, k, v, table


def bench_dense_bias(kern, reps, results, B=2, H=16, S=4096, D=64):
    key = "dense_bias_d64"
    results[key] = {"shape": dict(B=B, H=H, S=S, D=D, bias=[1, H, S, S], dtype="bf16")}
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=BF16).requires_grad_(True) for _ in range(3))
    bias = torch.randn(1, H, S, S, device="cuda", dtype=BF16).requires_grad_(True)
    flops = 4 * B * H * S * S * D
    results[key]["flops"] = {"fwd": flops, "bwd": 2.5 * flops}

    def ours(reps):
        f = lambda: kern.attention(q, k, v, bias=bias)
        return measure(f, autograd_grads([q, k, v, bias]), reps)

    def ours_nobias(reps):
        return measure(lambda: kern.attention(q, k, v), autograd_grads([q, k, v]), reps)

    def sdpa(backend, bias_grad=True, with_bias=True):
        def run(reps):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            b = (bias if bias_grad else bias.detach()) if with_bias else None
            leaves = [q, k, v] + ([bias] if (with_bias and bias_grad) else [])

            def f():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=b)

            return measure(f, autograd_grads(leaves), reps)

        return run

    def flex(reps):
        from torch.nn.attention.flex_attention import flex_attention

        fa = torch.compile(flex_attention, dynamic=False)
        b0 = bias[0]

        def score_mod(score, b, h, i, j):
            return score + b0[h, i, j]

        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        f = lambda: fa(qt, kt, vt, score_mod=score_mod)
        return measure(f, autograd_grads([q, k, v, bias]), reps)

    run_peer("ours", ours, results, key, reps)
    run_bwd_v1(ours, results, key, reps)
    run_peer("ours_bias_nograd", lambda r: measure(lambda: kern.attention(q, k, v, bias=bias.detach()),
                                                   autograd_grads([q, k, v]), r), results, key, reps)
    run_peer("ours_nobias", ours_nobias, results, key, reps)
    if not SKIP_PEERS:
        run_peer("sdpa_eff_bias", sdpa(SDPBackend.EFFICIENT_ATTENTION), results, key, reps)
        run_peer("cudnn_bias_nograd", sdpa(SDPBackend.CUDNN_ATTENTION, bias_grad=False), results, key, reps)
        run_peer("flex_score_mod", flex, results, key, reps)
        run_peer("sdpa_eff_nobias", sdpa(SDPBackend.EFFICIENT_ATTENTION, with_bias=False), results, key, reps)
        run_peer("cudnn_nobias", sdpa(SDPBackend.CUDNN_ATTENTION, with_bias=False), results, key, reps)
    del q, k, v, bias


def run_fa4(q, k, v, results, key, reps, causal=False):
    """FA4 on the same q / k / v (plain attention, optionally causal)."""
    run_peer("fa4", lambda r: measure(lambda: fa4_attention(q, k, v, causal=causal), autograd_grads([q, k, v]), r),
             results, key, reps)


def bench_nobias(kern, reps, results, B=1, H=16, S=16384, D=128, causal=False):
    key = f"{'causal' if causal else 'nobias'}_d{D}_{S // 1024}k"
    results[key] = {"shape": dict(B=B, H=H, S=S, D=D, causal=causal, dtype="bf16")}
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=BF16).requires_grad_(True) for _ in range(3))
    flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    results[key]["flops"] = {"fwd": flops, "bwd": 2.5 * flops}

    def ours(reps):
        return measure(lambda: kern.attention(q, k, v, causal=causal), autograd_grads([q, k, v]), reps)

    def sdpa(backend):
        def run(reps):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def f():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            return measure(f, autograd_grads([q, k, v]), reps)

        return run

    run_peer("ours", ours, results, key, reps)
    run_bwd_v1(ours, results, key, reps)
    if not SKIP_PEERS:
        run_peer("sdpa_flash", sdpa(SDPBackend.FLASH_ATTENTION), results, key, reps)
        run_peer("cudnn_nobias", sdpa(SDPBackend.CUDNN_ATTENTION), results, key, reps)
        run_peer("sdpa_eff_nobias", sdpa(SDPBackend.EFFICIENT_ATTENTION), results, key, reps)
        run_fa4(q, k, v, results, key, reps, causal)
    del q, k, v


def bench_key_padding(kern, reps, results, B=4, H=16, S=4096, D=128):
    """The same kernel with and without a [B, S] key-padding mask (every key real, so the work is identical and the
    difference is the mask's cost)."""
    key = "keypad_d128_4k"
    results[key] = {"shape": dict(B=B, H=H, S=S, D=D, key_padding=[B, S], dtype="bf16")}
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=BF16).requires_grad_(True) for _ in range(3))
    kpm = torch.ones(B, S, dtype=torch.bool, device="cuda")
    flops = 4 * B * H * S * S * D
    results[key]["flops"] = {"fwd": flops, "bwd": 2.5 * flops}
    run_peer("ours", lambda r: measure(lambda: kern.attention(q, k, v, key_padding_mask=kpm),
                                       autograd_grads([q, k, v]), r), results, key, reps)
    run_peer("ours_no_mask", lambda r: measure(lambda: kern.attention(q, k, v), autograd_grads([q, k, v]), r),
             results, key, reps)
    del q, k, v


def run_bwd_v1(fn, results, key, reps):
    """Our kernel with only the backward v3 disabled (WINATTN_FORCE_KERNEL=bwd_v1: forward v3, backward v1.1)."""
    os.environ["WINATTN_FORCE_KERNEL"] = "bwd_v1"
    try:
        run_peer("ours_bwd_v1", fn, results, key, reps)
    finally:
        del os.environ["WINATTN_FORCE_KERNEL"]


def bench_model_shape(kern, reps, results, key, B, S, H, D, bias=False, pad=0):
    """Attention shapes of the models the backward issue names: T5-style relative bias [1, H, S, S] with its
    gradient, Flux (no bias) and QwenImage-style key padding (the last `pad` keys of item 0 are padding; cuDNN gets
    the same mask as a boolean attn_mask)."""
    results[key] = {"shape": dict(B=B, H=H, S=S, D=D, bias=[1, H, S, S] if bias else None, pad=pad, dtype="bf16")}
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=BF16).requires_grad_(True) for _ in range(3))
    b = torch.randn(1, H, S, S, device="cuda", dtype=BF16).requires_grad_(True) if bias else None
    kpm = None
    if pad:
        kpm = torch.ones(B, S, dtype=torch.bool, device="cuda")
        kpm[0, S - pad:] = False
    flops = 4 * B * H * S * S * D
    results[key]["flops"] = {"fwd": flops, "bwd": 2.5 * flops}
    leaves = [q, k, v] + ([b] if bias else [])

    def ours(reps):
        return measure(lambda: kern.attention(q, k, v, bias=b, key_padding_mask=kpm), autograd_grads(leaves), reps)

    def sdpa(backend, bias_grad=True):
        def run(reps):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            mask = kpm[:, None, None, :] if kpm is not None else None
            if bias:
                mask = b if bias_grad else b.detach()
            lv = [q, k, v] + ([b] if (bias and bias_grad) else [])

            def f():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)

            return measure(f, autograd_grads(lv), reps)

        return run

    run_peer("ours", ours, results, key, reps)
    run_bwd_v1(ours, results, key, reps)
    if not SKIP_PEERS:
        run_peer("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION, bias_grad=False), results, key, reps)
        if bias:
            run_peer("sdpa_eff_bias", sdpa(SDPBackend.EFFICIENT_ATTENTION), results, key, reps)
        elif kpm is None:
            run_peer("sdpa_flash", sdpa(SDPBackend.FLASH_ATTENTION), results, key, reps)
            run_fa4(q, k, v, results, key, reps)
    del q, k, v, b


# ------------------------------------------------------------------------------------------------------------------
TARGETS = {  # v3 (Hopper) targets (ms or TFLOP/s) from the forward / backward / Swin issues
    "swin_w7": {"fwd_ms": 0.26, "bwd_ms": 0.52},
    "dense_bias_d64": {"fwd_ms": 0.45, "bwd_ms": 1.0},
    "nobias_d128_16k": {"fwd_tflops": 600, "bwd_tflops": 520},
    "nobias_d64_16k": {"bwd_tflops": 450},
    "nobias_d256_16k": {"bwd_tflops": 360},
    "t5_bias_d64_1k": {"fb_ms": 0.6},
}


def summarize(results):
    lines = []
    hdr = f"{'workload':<18}{'impl':<20}{'fwd ms':>9}{'bwd ms':>9}{'f+b ms':>9}{'fwd TF/s|GB/s':>15}{'bwd TF/s|GB/s':>15}{'peak MB':>9}{'ours x':>8}"
    lines.append(hdr)
    for key, res in results.items():
        if not isinstance(res, dict) or "ours" not in res:
            continue
        ours_fb = res["ours"].get("fb_ms")
        for name, r in res.items():
            if name in ("shape", "flops", "io_bytes") or not isinstance(r, dict):
                continue
            if "error" in r:
                lines.append(f"{key:<18}{name:<20}  error: {r['error'][:90]}")
                continue
            if "flops" in res:
                rf = res["flops"]["fwd"] / r["fwd_ms"] / 1e9
                rb = res["flops"]["bwd"] / r["bwd_ms"] / 1e9
                r["fwd_tflops"], r["bwd_tflops"] = rf, rb
                rate = (f"{rf:>11.0f} TF", f"{rb:>11.0f} TF")
            else:
                rf = res["io_bytes"]["fwd"] / r["fwd_ms"] / 1e6
                rb = res["io_bytes"]["bwd"] / r["bwd_ms"] / 1e6
                r["fwd_gbps"], r["bwd_gbps"] = rf, rb
                rate = (f"{rf:>11.0f} GB", f"{rb:>11.0f} GB")
            ratio = r["fb_ms"] / ours_fb if ours_fb else float("nan")
            r["ratio_fb_vs_ours"] = ratio
            lines.append(f"{key:<18}{name:<20}{r['fwd_ms']:>9.3f}{r['bwd_ms']:>9.3f}{r['fb_ms']:>9.3f}"
                         f"{rate[0]:>15}{rate[1]:>15}{r['peak_mb']:>9.0f}{ratio:>8.2f}"
                         f"   host {r.get('fwd_host_ms', float('nan')):.3f}/{r.get('bwd_host_ms', float('nan')):.3f}")
        tgt = TARGETS.get(key, {})
        if tgt and "fwd_ms" in res["ours"]:
            met = []
            for m, val in tgt.items():
                have = res["ours"].get(m)
                ok = have is not None and ((have <= val) if m.endswith("_ms") else (have >= val))
                met.append(f"{m} {have:.3f} vs {val} {'MET' if ok else 'MISSED'}" if have is not None else m)
            res["targets"] = met
            lines.append(f"{'':<18}target: " + "; ".join(met))
    return "\n".join(lines)


WORKLOADS = ["swin_w7", "swin_w8", "swin_w12", "swin_w16", "dense", "nobias", "nobias_d64", "nobias_d256", "causal",
             "keypad", "t5", "flux", "qwen"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="build/torch-stable-abi210-cu130-x86_64-linux")
    ap.add_argument("--out", default="results/bench_cuda.json")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", nargs="*", default=None,
                    help="subset: " + " ".join(WORKLOADS))
    ap.add_argument("--skip-peers", action="store_true", help="time only our kernel")
    ap.add_argument("--sweep-g", nargs="*", type=int, default=[], help="Swin: also time these windows-per-CTA")
    ap.add_argument("--profile", action="store_true", help="profiler ranges for ncu instead of timing (no peers)")
    args = ap.parse_args()
    global SKIP_PEERS, SWEEP_G, PROFILE
    SKIP_PEERS, SWEEP_G, PROFILE = args.skip_peers or args.profile, args.sweep_g, args.profile
    kern = load_kernel(args.variant)
    warm_up_gpu()
    results = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "variant": str(args.variant)}}
    only = set(args.only or WORKLOADS)
    torch.manual_seed(0)
    if "swin_w7" in only:
        bench_swin(kern, 7, 16384, args.reps, results)
    if "swin_w8" in only:
        bench_swin(kern, 8, 16384, args.reps, results)
    if "swin_w12" in only:
        bench_swin(kern, 12, 8192, args.reps, results)
    if "swin_w16" in only:
        bench_swin(kern, 16, 4096, args.reps, results)
    if "dense" in only:
        bench_dense_bias(kern, args.reps, results)
    if "nobias" in only:
        bench_nobias(kern, args.reps, results)
    if "nobias_d64" in only:
        bench_nobias(kern, args.reps, results, D=64)
    if "nobias_d256" in only:
        bench_nobias(kern, args.reps, results, H=8, D=256)
    if "causal" in only:
        bench_nobias(kern, args.reps, results, causal=True)
    if "keypad" in only:
        bench_key_padding(kern, args.reps, results)
    if "t5" in only:
        bench_model_shape(kern, args.reps, results, "t5_bias_d64_1k", B=8, S=1024, H=16, D=64, bias=True)
    if "flux" in only:
        bench_model_shape(kern, args.reps, results, "flux_d128", B=1, S=4608, H=24, D=128)
    if "qwen" in only:
        bench_model_shape(kern, args.reps, results, "qwen_keypad_d128", B=2, S=4352, H=24, D=128, pad=256)
    table = summarize(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(table)


if __name__ == "__main__":
    main()
