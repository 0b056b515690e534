"""End-to-end model benchmarks on the H200: the kernel as users reach it (published to the embedded Hub, loaded
verified by winattn.load) inside real diffusers / timm models with random weights, against the frameworks' own
attention in the same run.

    python benchmarks/bench_models.py --variant build/torch-stable-abi210-cu130-x86_64-linux [--out results/bench_models.json]

Workloads:
  * flux_step: diffusers `FluxTransformer2DModel` with its default config (the 12B Flux transformer, random bf16
    weights built on the GPU, no download), one denoising step at 1024 px (4096 image + 512 text tokens = 4608),
    `native` vs `window_attn_hub` (set_attention_backend). Forward only (inference).
  * swin_t_train: timm `swin_tiny_patch4_window7_224`, batch 128, bf16 autocast, one training step (forward,
    backward, SGD update), timm's attention vs `kernelize_swin`.
Timing: CUDA events around each step after warm-up, median of --reps.
On the H200 image (huggingface_hub 1.33, which has no kernel repo type) it needs, as wheels (.whl/, see
../shared/device/wheelhouse.sh): kernels 0.17.2, diffusers 0.42.1, kernel-abi-check 0.14.1 (publish's checks) and
huggingface_hub 2.4.0 with httpx2 / httpcore2 2.16.2, truststore 0.10.5, click 8.5.1, hf-xet 1.8.0.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
REPO, TOKEN, ORG = "winattn/window-attention", "bench-token", "winattn"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def point_clients(url: str, home: Path):
    """The Hub clients read their endpoint and caches at import: set them before importing anything of theirs."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "LOCAL_KERNELS"):
        os.environ.pop(var, None)
    os.environ.update({"HF_ENDPOINT": url, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"),
                       "WINATTN_CACHE": str(home / "winattn"), "HF_HUB_DISABLE_XET": "1",
                       "HF_HUB_DISABLE_PROGRESS_BARS": "1"})


def publish_variant(variant: Path, work: Path):
    """Start the embedded Hub and publish `variant` as winattn/window-attention (trusted org)."""
    from winattn.hub import HubServer
    from winattn.publish import publish

    build_dir = work / "build"
    shutil.copytree(variant, build_dir / variant.name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "metadata.json.sigstore"))
    srv = HubServer(work / "store", tokens=[TOKEN], trusted_orgs=[ORG], port=int(os.environ["BENCH_PORT"])).start()
    publish(REPO, build_dir=build_dir, endpoint=srv.url, token=TOKEN, repo_root=REPO_ROOT)
    return srv


def cuda_time(fn, reps, warmup=3):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def bench_flux(reps):
    import torch
    from diffusers import FluxTransformer2DModel

    import winattn.integrations.diffusers as wd

    wd.register()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = FluxTransformer2DModel().to(torch.bfloat16).eval()
    cfg = model.config
    n_img, n_txt = 4096, 512  # 1024 px: a 128 x 128 latent in 2 x 2 patches; T5 context of 512
    kw = dict(
        hidden_states=torch.randn(1, n_img, cfg.in_channels, device="cuda", dtype=torch.bfloat16),
        encoder_hidden_states=torch.randn(1, n_txt, cfg.joint_attention_dim, device="cuda", dtype=torch.bfloat16),
        pooled_projections=torch.randn(1, cfg.pooled_projection_dim, device="cuda", dtype=torch.bfloat16),
        timestep=torch.tensor([0.5], device="cuda", dtype=torch.bfloat16),
        img_ids=torch.randn(n_img, 3, device="cuda"), txt_ids=torch.zeros(n_txt, 3, device="cuda"),
        return_dict=False)
    if cfg.guidance_embeds:
        kw["guidance"] = torch.tensor([3.5], device="cuda", dtype=torch.bfloat16)
    res = {"params_b": sum(p.numel() for p in model.parameters()) / 1e9, "tokens": n_img + n_txt}
    outs = {}
    with torch.no_grad():
        for backend in ("native", "window_attn_hub"):
            model.set_attention_backend(backend)
            outs[backend] = model(**kw)[0].float()
            res[backend] = {"step_ms": cuda_time(lambda: model(**kw), reps)}
    ref = outs["native"]
    res["max_abs_diff_vs_native"] = (outs["window_attn_hub"] - ref).abs().max().item()
    res["ref_max_abs"] = ref.abs().max().item()
    res["speedup"] = res["native"]["step_ms"] / res["window_attn_hub"]["step_ms"]
    del model
    torch.cuda.empty_cache()
    return res


def bench_swin(reps, batch=128):
    import copy

    import timm
    import torch

    from winattn.integrations.timm import kernelize_swin

    torch.manual_seed(0)
    base = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).cuda()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    res = {"batch": batch}
    for name, model in (("native", copy.deepcopy(base)), ("kernelize_swin", kernelize_swin(copy.deepcopy(base)))):
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        res[name] = {"step_ms": cuda_time(step, reps)}
        del model, opt
        torch.cuda.empty_cache()
    res["speedup"] = res["native"]["step_ms"] / res["kernelize_swin"]["step_ms"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="build/torch-stable-abi210-cu130-x86_64-linux")
    ap.add_argument("--out", default="results/bench_models.json")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", nargs="*", default=None, help="subset: flux_step swin_t_train")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-models-"))
    os.environ["BENCH_PORT"] = str(free_port())
    point_clients(f"http://127.0.0.1:{os.environ['BENCH_PORT']}", work / "home")
    sys.path.insert(0, str(REPO_ROOT))
    # The models here need neither `transformers` nor `peft`; the H200 image's ones refuse huggingface_hub 2.x at
    # import, and diffusers imports them when they are installed. Marking them absent keeps diffusers off them.
    for name in ("transformers", "peft"):
        sys.modules.setdefault(name, None)
    import torch

    srv = publish_variant(Path(args.variant).resolve(), work)
    results = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "date": time.strftime("%Y-%m-%d %H:%M:%S")}}
    try:
        for name, fn in (("flux_step", bench_flux), ("swin_t_train", bench_swin)):
            if args.only and name not in args.only:
                continue
            try:
                results[name] = fn(args.reps)
            except Exception as e:  # one model failing still lets the other run; the error is recorded
                results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(name, json.dumps(results[name]), flush=True)
    finally:
        srv.stop()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
