"""H200 forward benchmark of the non-window kernels (Hopper forward v3) against the peers, in one run.

    python benchmarks/bench_fwd.py --variant build/torch-stable-abi210-cu130-x86_64-linux [--out results/bench_fwd.json]

Workloads (bf16, the shapes of issue "Hopper forward v3"): no bias S=16k at D = 64 / 128 / 256, causal D=128 S=16k,
Flux 1024 px (B=1, S=4608, H=24, D=128), QwenImage-style key padding (B=2, S=4352, H=24, D=128, the second item
padded after 4000 keys), Wan video (B=1, S=32760, H=12, D=128), dense bias [1,H,S,S] (B=2, H=16, S=4096, D=64), and the same Qwen / dense
shapes without their mask / bias (and with a key-padding mask that pads nothing) for the cost of each term.
Implementations: ours (v3) and ours_v1 (WINATTN_FORCE_KERNEL=v1) from the same binary; peers cuDNN
SDPA (with the same mask / bias), SDPA flash (no mask), FlashAttention-4 (no mask; causal: staged by
../shared/device/fa4_wheels.sh, else its rows say why it did not run), FlexAttention (bias as score_mod). Each of
ours is first checked against an fp32 SDPA reference on the same inputs (max abs error printed), then timed: CUDA
events after warm-up, median of --reps (bench_cuda.cuda_time).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cuda import cuda_time, fa4_attention, load_kernel, warm_up_gpu  # noqa: E402

BF16 = torch.bfloat16
PROFILE = False  # --profile: no timing, one call of ours per workload inside a profiler range (ncu)
OURS = {"ours": {}, "ours_v1": {"WINATTN_FORCE_KERNEL": "v1"}}
# --ab: v3 with one of its choices undone (the raw path on the narrow tile; one CTA per tile instead of persistent)
OURS_AB = {"ours_narrow": {"WINATTN_FORCE_KERNEL": "fwd_v3_narrow"},
           "ours_nonpersist": {"WINATTN_FORCE_KERNEL": "fwd_v3_per_tile"}}


def workloads():
    return {
        "nobias_d64_16k": dict(B=1, S=16384, H=16, D=64),
        "nobias_d128_16k": dict(B=1, S=16384, H=16, D=128),
        "nobias_d256_16k": dict(B=1, S=16384, H=8, D=256),
        "causal_d128_16k": dict(B=1, S=16384, H=16, D=128, causal=True),
        "flux_1024px": dict(B=1, S=4608, H=24, D=128),
        "qwen_keypad": dict(B=2, S=4352, H=24, D=128, kp_real=(4352, 4000)),
        "qwen_nomask": dict(B=2, S=4352, H=24, D=128),  # the cost of the mask: qwen_keypad / this
        "keypad_none_padded": dict(B=2, S=4352, H=24, D=128, kp_real=(4352, 4352)),  # a mask that pads nothing
        "wan_video": dict(B=1, S=32760, H=12, D=128),
        "dense_bias_d64": dict(B=2, S=4096, H=16, D=64, bias=True),
        "dense_nobias_d64": dict(B=2, S=4096, H=16, D=64),  # the cost of the bias: dense_bias_d64 / this
    }


def with_env(env, fn):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_workload(kern, name, cfg, reps, peers, ours_impls):
    B, S, H, D = cfg["B"], cfg["S"], cfg["H"], cfg["D"]
    causal = cfg.get("causal", False)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=BF16) for _ in range(3))
    kpm = None
    if "kp_real" in cfg:
        kpm = torch.zeros(B, S, dtype=torch.bool, device="cuda")
        for b, n in enumerate(cfg["kp_real"]):
            kpm[b, :n] = True
    bias = torch.randn(1, H, S, S, device="cuda", dtype=BF16) if cfg.get("bias") else None
    flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    res = {"shape": cfg, "flops": flops}
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    sdpa_mask = bias if bias is not None else (kpm[:, None, None, :] if kpm is not None else None)

    def ours():
        return kern.attention(q, k, v, bias=bias, key_padding_mask=kpm, causal=causal)

    if PROFILE:  # one call of ours inside a CUDA profiler range, after a warm-up call (for ncu)
        ours()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        ours()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return res

    # reference: fp32 SDPA on the last item (the padded one) and the first heads (bounded memory)
    hs, bl = slice(0, min(H, 4)), slice(B - 1, B)
    ref_mask = None if sdpa_mask is None else sdpa_mask[:, hs].float() if bias is not None else sdpa_mask[bl]
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        ref = F.scaled_dot_product_attention(qt[bl, hs].float(), kt[bl, hs].float(), vt[bl, hs].float(),
                                             attn_mask=ref_mask, is_causal=causal).transpose(1, 2)
    for impl, env in ours_impls.items():
        try:
            out = with_env(env, ours)
            err = (out[bl, :, hs].float() - ref).abs().max().item()
            ms = with_env(env, lambda: cuda_time(ours, reps))
            res[impl] = {"fwd_ms": ms, "tflops": flops / ms / 1e9, "max_err": err}
        except Exception as e:  # report, continue
            res[impl] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
        torch.cuda.empty_cache()

    def sdpa(backend, mask):
        def f():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal)

        return f

    peer_fns = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, sdpa_mask)}
    if sdpa_mask is None:
        peer_fns["sdpa_flash"] = sdpa(SDPBackend.FLASH_ATTENTION, None)
        peer_fns["fa4"] = lambda: fa4_attention(q, k, v, causal=causal)
    if bias is not None:
        from torch.nn.attention.flex_attention import flex_attention

        fa = torch.compile(flex_attention, dynamic=False)
        b0 = bias[0]
        peer_fns["flex"] = lambda: fa(qt, kt, vt, score_mod=lambda s, b, h, i, j: s + b0[h, i, j])
    if peers:
        for impl, f in peer_fns.items():
            try:
                ms = cuda_time(f, reps)
                res[impl] = {"fwd_ms": ms, "tflops": flops / ms / 1e9}
            except Exception as e:
                res[impl] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
            torch.cuda.empty_cache()
    return res


PEER_NAMES = ("cudnn", "sdpa_flash", "flex", "fa4")


def summarize(results):
    lines = [f"{'workload':<18}{'impl':<12}{'fwd ms':>9}{'TF/s':>7}{'max err':>10}{'vs best peer':>14}"]
    for name, res in results.items():
        if name == "meta":
            continue
        peer_ms = [r["fwd_ms"] for i, r in res.items() if i in PEER_NAMES and "fwd_ms" in r]
        best = min(peer_ms) if peer_ms else float("nan")
        for impl, r in res.items():
            if impl in ("shape", "flops"):
                continue
            if "error" in r:
                lines.append(f"{name:<18}{impl:<12}  error: {r['error'][:90]}")
                continue
            err = f"{r['max_err']:.2e}" if "max_err" in r else ""
            lines.append(f"{name:<18}{impl:<12}{r['fwd_ms']:>9.3f}{r['tflops']:>7.0f}{err:>10}"
                         f"{best / r['fwd_ms']:>13.2f}x")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="build/torch-stable-abi210-cu130-x86_64-linux")
    ap.add_argument("--out", default="results/bench_fwd.json")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", nargs="*", default=None, help="subset: " + " ".join(workloads()))
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--ab", action="store_true", help="also v3 with its tile / persistence choices undone")
    ap.add_argument("--skip-old", action="store_true", help="skip ours_v1")
    ap.add_argument("--profile", action="store_true",
                    help="no timing: one call of ours per workload in a profiler range, for "
                         "`ncu --profile-from-start off` (scripts/gpu_profile.sh)")
    args = ap.parse_args()
    global PROFILE
    PROFILE = args.profile
    kern = load_kernel(args.variant)
    warm_up_gpu()
    results = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}}
    torch.manual_seed(0)
    for name, cfg in workloads().items():
        if args.only and name not in args.only:
            continue
        impls = {k: v for k, v in OURS.items() if not (args.skip_old and k != "ours")}
        if args.ab:
            impls.update(OURS_AB)
        results[name] = run_workload(kern, name, cfg, args.reps, not args.skip_peers, impls)
        print(f"done {name}", file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    if not PROFILE:
        print(summarize(results))


if __name__ == "__main__":
    main()
