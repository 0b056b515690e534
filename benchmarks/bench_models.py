"""End-to-end model benchmarks on the H200: the kernel as users reach it (published to the embedded Hub, loaded
verified by winattn.load) inside real diffusers / timm models with random weights, against the frameworks' own
attention in the same run.

    python benchmarks/bench_models.py --variant build/torch-stable-abi210-cu130-x86_64-linux [--out results/bench_models.json]
        [--only flux_step flux_train swin_t_train swin_b384_train beit_b16_train sdxl_step
        wan_step] [--flux-layers DOUBLE SINGLE]

Workloads:
  * flux_step: diffusers `FluxTransformer2DModel` with its default config (the 12B Flux transformer, random bf16
    weights built on the GPU, no download), one denoising step at 1024 px (4096 image + 512 text tokens = 4608),
    `native` vs `window_attn_hub` (set_attention_backend). Forward only (inference).
  * flux_train: the same model and inputs, one training step (forward, MSE against a random target, backward, SGD
    without momentum) in bf16; the full model fits an H200 (estimate above `bench_flux_train`; peak memory is
    recorded), `--flux-layers` runs fewer blocks of the same width instead. Before timing, one forward + backward per
    backend from the same weights gives the loss and the first block's `to_q.weight` gradient vs native.
  * swin_t_train: timm `swin_tiny_patch4_window7_224` (window 7, N = 49), batch 128, bf16 autocast, one training step
    (forward, cross entropy, backward, SGD update), timm's attention (its default unfused path: q k^T + table +
    mask, softmax, @ v) vs `kernelize_swin` (Mode.TRAINING).
  * swin_b384_train: the same with timm `swin_base_patch4_window12_384` (window 12, N = 144), batch 32, 384 px.
    Both Swin workloads check the loss and a shifted block's relative-position table gradient (the kernel's dTable)
    vs timm's, from one eval-mode forward + backward (no stochastic depth).
  * beit_b16_train: timm `beit_base_patch16_224` (N = 197 with the class token, 12 heads of 64, a (2W-1)^2 + 3 =
    732-row table per block), batch 128, bf16 autocast, one training step as the Swin ones, timm's attention (its
    fused path: SDPA with the gathered [1, 12, 197, 197] bias as attn_mask, dBias through autograd) vs
    `kernelize_relpos` (Mode.TRAINING: the table gathered into one [1, 12, 197, 197] bias, dBias from the kernel). timm initialises the tables
    to zero; they are drawn from N(0, 0.5^2) here so that the bias takes part in the check (the loss and block 0's
    table gradient vs timm, eval mode).
  * sdxl_step: diffusers `UNet2DConditionModel` with SDXL base 1.0's UNet config (2.6 B random bf16 weights built on
    the GPU), one denoising step at 1024 px with classifier-free guidance (batch 2: a 128 x 128 latent, 77 text
    tokens of 2048, pooled text 1280 + 6 time ids). Its attention (4096- and 1024-token self-attention, 77-key
    cross-attention, heads of 64) is diffusers' `Attention` with `AttnProcessor2_0`, which calls torch SDPA itself:
    `set_attention_backend` does not reach it (it changes only processors of the attention dispatcher). So
    `native` is the model as built (AttnProcessor2_0, what users run), `window_attn_hub` replaces every processor
    by `DispatchAttnProcessor` (the same computation through `dispatch_attention_fn`) and selects the backend with
    `set_attention_backend`; `native_dispatch` (the same processor on diffusers' `native` backend) separates the
    dispatcher's own cost. Forward only; the output vs native and the count of modules on the backend are recorded.
    The three take turns, SDXL_ROUNDS rounds of --reps steps each, and each reads the median of its rounds' medians
    (`rounds_ms` keeps them): the step is host-paced on the H100 / H200 hosts, whose pace drifts by tens of percent
    within a process, so timing the three one after the other compared different hosts (RESULTS v4.9, "Thirty-first
    session").
  * wan_step: diffusers `WanTransformer3DModel` with Wan 2.1 T2V 1.3B's config (1.42 B random weights, bf16 except
    what diffusers keeps in fp32), one transformer call of a denoising step at 480 x 832 px and 81 frames (32760
    tokens; 512 text tokens), `native` vs `window_attn_hub` (set_attention_backend: Wan's processor calls the
    dispatcher). Each of its 30 blocks makes one 32760-token self-attention and one cross-attention to the text,
    heads of 128. Forward only (issue 30's Wan inference target); the output vs native is recorded.
Timing: CUDA events around each step after warm-up, median of --reps; training workloads also record the peak
allocation of the timed steps (`peak_gib`). The workload functions take `device=` so that
tests/integrations/test_bench_models.py runs them on tiny configs with the CPU build.
On the H200 image (huggingface_hub 1.33, which has no kernel repo type) it needs, as wheels (.whl/, see
../shared/device/wheelhouse.sh): kernels 0.17.2, diffusers 0.42.1 (the Flux, SDXL and Wan workloads), kernel-abi-check
0.14.1 (publish's checks) and huggingface_hub 2.4.0 with httpx2 / httpcore2 2.16.2, truststore 0.10.5, click 8.5.1,
hf-xet 1.8.0; timm (the Swin and BEiT workloads) comes with the image (the BEiT layer is tested with timm 1.0.31:
`../shared/device/wheelhouse.sh timm==1.0.31` adds that version, which then shadows the image's). The BEiT workload
needs a variant built from a tree with `layers.BeitAttention` (the kernel's Python files are copied into the variant
at build time).
"""

import argparse
import contextlib
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


def cpu_time(fn, reps, warmup=1):
    """Median wall time in ms on the CPU (the tiny-config test runs the workloads there)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def timed(fn, reps, device):
    """{"step_ms": ...}, with the peak allocation of the timed steps on the GPU."""
    import torch

    if device != "cuda":
        return {"step_ms": cpu_time(fn, reps)}
    torch.cuda.reset_peak_memory_stats()
    step_ms = cuda_time(fn, reps)
    return {"step_ms": step_ms, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def versus_native(res: dict, outs: dict) -> None:
    """The inference workloads' agreement and speed against `native` (outs: label -> fp32 output), into `res`."""
    ref = outs["native"]
    res["max_abs_diff_vs_native"] = (outs["window_attn_hub"] - ref).abs().max().item()
    res["ref_max_abs"] = ref.abs().max().item()
    res["speedup"] = res["native"]["step_ms"] / res["window_attn_hub"]["step_ms"]


# ----------------------------------------------------------------------------------------------------------------
# Training steps, shared by the Flux and Swin workloads


def make_step(model, loss_fn, lr):
    """One training step: zero grads, forward + loss, backward, SGD update; returns the (detached) loss.

    SGD without momentum keeps no optimizer state: memory is weights + grads + activations.
    """
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def loss_and_grad(model, loss_fn, param: str):
    """Loss and the fp32 gradient of parameter `param` from one forward + backward, without an update."""
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    grad = dict(model.named_parameters())[param].grad.float().clone()
    model.zero_grad(set_to_none=True)
    return loss.item(), grad


def compare(ref, got, param: str) -> dict:
    """Loss and grad differences of `got` against `ref`, both (loss, grad of `param`) from the same weights."""
    (ref_loss, ref_grad), (loss, grad) = ref, got
    return {"loss_ref": ref_loss, "loss": loss, "loss_abs_diff": abs(loss - ref_loss), "grad_param": param,
            "grad_max_abs_diff": (grad - ref_grad).abs().max().item(), "grad_ref_max_abs": ref_grad.abs().max().item()}


# ----------------------------------------------------------------------------------------------------------------
# Flux (diffusers)


def build_flux(device, layers=None, **config):
    """Random-weight bf16 `FluxTransformer2DModel` built on `device`: diffusers' default config (Flux.1's 12B
    transformer) updated by `config`; `layers=(double, single)` keeps its width and heads (attention shapes as in the
    full model) with fewer blocks."""
    import torch
    from diffusers import FluxTransformer2DModel

    if layers is not None:
        config.update(num_layers=layers[0], num_single_layers=layers[1])
    torch.manual_seed(0)
    with torch.device(device):
        return FluxTransformer2DModel(**config).to(torch.bfloat16)


def flux_inputs(cfg, device, n_img=4096, n_txt=512) -> dict:
    """Forward keywords for `n_img` image and `n_txt` text tokens (1024 px: a 128 x 128 latent in 2 x 2 patches; T5
    context of 512)."""
    import torch

    bf16 = torch.bfloat16
    kw = dict(
        hidden_states=torch.randn(1, n_img, cfg.in_channels, device=device, dtype=bf16),
        encoder_hidden_states=torch.randn(1, n_txt, cfg.joint_attention_dim, device=device, dtype=bf16),
        pooled_projections=torch.randn(1, cfg.pooled_projection_dim, device=device, dtype=bf16),
        timestep=torch.tensor([0.5], device=device, dtype=bf16),
        img_ids=torch.randn(n_img, 3, device=device), txt_ids=torch.zeros(n_txt, 3, device=device),
        return_dict=False)
    if cfg.guidance_embeds:
        kw["guidance"] = torch.tensor([3.5], device=device, dtype=bf16)
    return kw


def bench_flux(reps):
    import torch

    import winattn.integrations.diffusers as wd

    wd.register()
    model = build_flux("cuda").eval()
    kw = flux_inputs(model.config, "cuda")
    res = {"params_b": sum(p.numel() for p in model.parameters()) / 1e9,
           "tokens": kw["hidden_states"].shape[1] + kw["encoder_hidden_states"].shape[1]}
    outs = {}
    with torch.no_grad():
        for backend in ("native", "window_attn_hub"):
            model.set_attention_backend(backend)
            outs[backend] = model(**kw)[0].float()
            res[backend] = {"step_ms": cuda_time(lambda: model(**kw), reps)}
    versus_native(res, outs)
    del model
    torch.cuda.empty_cache()
    return res


# Memory of the full 12B model's training step at 4608 tokens, bf16 (no gradient checkpointing, SGD without
# momentum): weights 11.9 B x 2 B = 23.8 GB, grads 23.8 GB, activations saved for the backward ~46 GB (counted with
# saved_tensors_hooks on a meta-device model with the real width, excluding parameters and the S x S scores a flash
# backward does not keep: 0.88 GB per double block x 19 + 0.77 GB per single block x 38 + 0.08 GB outside the
# blocks) = ~94 GB, plus backward temporaries and allocator slack, of the H200's 139 GiB (149 GB). It should fit, so
# the full model is the default; `--flux-layers` (fewer blocks, same attention shapes) is there in case it does not.
# The build itself peaks at ~71 GB (fp32 construction, then the bf16 copy) before the step.


def flux_loss_fn(model, kw, target):
    import torch

    return lambda: torch.nn.functional.mse_loss(model(**kw)[0].float(), target)


def bench_flux_train(reps, layers=None, *, device="cuda", tokens=(4096, 512), **config):
    """One Flux training step (forward, MSE against a random target, backward, SGD) native vs window_attn_hub."""
    import torch

    import winattn.integrations.diffusers as wd

    wd.register()
    model = build_flux(device, layers, **config).train()
    if device == "cuda":
        torch.cuda.empty_cache()  # the fp32 construction's blocks
    cfg = model.config
    kw = flux_inputs(cfg, device, *tokens)
    target = torch.randn(1, tokens[0], model.proj_out.out_features, device=device)
    loss_fn = flux_loss_fn(model, kw, target)
    # The first block's query projection: its gradient passes through every attention backward of the model.
    param = ("transformer_blocks" if cfg.num_layers else "single_transformer_blocks") + ".0.attn.to_q.weight"
    res = {"params_b": sum(p.numel() for p in model.parameters()) / 1e9, "tokens": sum(tokens),
           "layers": [cfg.num_layers, cfg.num_single_layers], "full_model": layers is None and not config}
    # native = torch SDPA with its flash / memory-efficient kernels: on the H200 (torch 2.11, cuDNN 9) SDPA's default
    # pick for this training step, cuDNN, fails in its backward ("mha_graph.execute(...) is_good()", seen
    # 2026-12-01) and leaves the CUDA context broken for everything after it
    def native_sdpa():
        if device != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])

    res["native_sdpa"] = "flash, efficient (cuDNN excluded: its backward fails here)"
    checks = {}
    for backend in ("native", "window_attn_hub"):  # both from the initial weights, before any update
        model.set_attention_backend(backend)
        with native_sdpa() if backend == "native" else contextlib.nullcontext():
            checks[backend] = loss_and_grad(model, loss_fn, param)
    res["check_vs_native"] = compare(checks["native"], checks["window_attn_hub"], param)
    del checks
    step = make_step(model, loss_fn, lr=1e-4)
    for backend in ("native", "window_attn_hub"):
        model.set_attention_backend(backend)
        with native_sdpa() if backend == "native" else contextlib.nullcontext():
            res[backend] = timed(step, reps, device)
    res["speedup"] = res["native"]["step_ms"] / res["window_attn_hub"]["step_ms"]
    del model, step
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------------------------------------------
# Swin (timm)

# name: (timm model, batch, image size). Swin-B 384 (window 12, N = 144) at batch 32: about 15 GB of activations
# outside attention (stage 1: 96 x 96 tokens x C128, 64 windows per image; stage 3: 18 blocks) plus about 13 GB of
# scores that timm's attention keeps for its backward (its default unfused path: fused_attn is "experimental" for
# Swin; fp32 logits and softmax under autocast, their bf16 copy), ~30 GB: room to spare on the H200.
SWIN = {
    "swin_t_train": ("swin_tiny_patch4_window7_224", 128, 224),
    "swin_b384_train": ("swin_base_patch4_window12_384", 32, 384),
}


def swin_loss_fn(model, x, y):
    import torch

    def loss():
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return torch.nn.functional.cross_entropy(model(x), y)

    return loss


def bench_timm_train(reps, model_name, batch, img_size, *, ours, kernelize_fn, param, device="cuda", init=None,
                     **model_kwargs):
    """One timm training step (bf16 autocast, cross entropy, SGD), timm's attention vs `kernelize_fn(model,
    mode=Mode.TRAINING)`, reported under `ours`; the loss and `param`'s gradient are checked vs timm's.
    `init(model)`, if given, changes the random weights before both copies are made."""
    import copy

    import timm
    import torch

    from winattn.integrations.timm import Mode

    torch.manual_seed(0)
    base = timm.create_model(model_name, pretrained=False, img_size=img_size, **model_kwargs).to(device)
    if init is not None:
        init(base)
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    y = torch.randint(0, base.num_classes, (batch,), device=device)
    res = {"model": model_name, "batch": batch, "img_size": img_size}
    checks = {}
    for name in ("native", ours):
        model = copy.deepcopy(base)
        if name == ours:
            kernelize_fn(model, mode=Mode.TRAINING)
        loss_fn = swin_loss_fn(model, x, y)
        # Checked in eval mode: Swin and BEiT have no batch norm, so eval only turns off stochastic depth (Swin's
        # drop_path_rate is 0.1 by default), whose random masks would differ between the two models' steps.
        checks[name] = loss_and_grad(model.eval(), loss_fn, param)
        model.train()
        step = make_step(model, loss_fn, lr=1e-3)
        res[name] = timed(step, reps, device)
        del model, step, loss_fn
        if device == "cuda":
            torch.cuda.empty_cache()
    res["check_vs_native"] = compare(checks["native"], checks[ours], param)
    res["speedup"] = res["native"]["step_ms"] / res[ours]["step_ms"]
    return res


def bench_swin(reps, model_name, batch, img_size, *, device="cuda", **model_kwargs):
    """One timm Swin training step (bf16 autocast, cross entropy, SGD), timm's attention vs `kernelize_swin`."""
    from winattn.integrations.timm import kernelize_swin

    # The shifted block of stage 1: its table's gradient is the kernel's dBias (dTable) pass.
    return bench_timm_train(reps, model_name, batch, img_size, ours="kernelize_swin", kernelize_fn=kernelize_swin,
                            param="layers.0.blocks.1.attn.relative_position_bias_table", device=device,
                            **model_kwargs)


# ----------------------------------------------------------------------------------------------------------------
# BEiT (timm)

# name: (timm model, batch, image size). BEiT-B/16 at 224 px: N = 197 (14 x 14 patches + the class token), 12 heads
# of 64, the "[1, H, N, N] bias shared over a large batch" class.
BEIT = {"beit_b16_train": ("beit_base_patch16_224", 128, 224)}


def randomize_rel_pos_tables(model, std=0.5):
    """Draw every `relative_position_bias_table` of `model` from N(0, std^2) (timm's BEiT starts them at zero, which
    would leave the bias out of the loss check)."""
    import torch

    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                p.normal_(0, std)


def bench_beit(reps, model_name, batch, img_size, *, device="cuda", **model_kwargs):
    """One timm BEiT training step (bf16 autocast, cross entropy, SGD), timm's attention vs `kernelize_relpos`."""
    from winattn.integrations.timm import kernelize_relpos

    # Block 0's table: its gradient is the kernel's dTable (every entry of the [N, N] index, the class-token rows too).
    return bench_timm_train(reps, model_name, batch, img_size, ours="kernelize_relpos", kernelize_fn=kernelize_relpos,
                            param="blocks.0.attn.relative_position_bias_table", device=device,
                            init=randomize_rel_pos_tables, **model_kwargs)


# ----------------------------------------------------------------------------------------------------------------
# SDXL (diffusers)

# stabilityai/stable-diffusion-xl-base-1.0, unet/config.json (diffusers 0.19), every field but the `_` ones; no
# download. Its "attention_head_dim" is diffusers' historical name for the head *count* per block (5, 10, 20 for
# 320, 640, 1280 channels: heads of 64).
SDXL_UNET = {
    "act_fn": "silu", "addition_embed_type": "text_time", "addition_embed_type_num_heads": 64,
    "addition_time_embed_dim": 256, "attention_head_dim": [5, 10, 20], "block_out_channels": [320, 640, 1280],
    "center_input_sample": False, "class_embed_type": None, "class_embeddings_concat": False, "conv_in_kernel": 3,
    "conv_out_kernel": 3, "cross_attention_dim": 2048, "cross_attention_norm": None,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"], "downsample_padding": 1,
    "dual_cross_attention": False, "encoder_hid_dim": None, "encoder_hid_dim_type": None, "flip_sin_to_cos": True,
    "freq_shift": 0, "in_channels": 4, "layers_per_block": 2, "mid_block_only_cross_attention": None,
    "mid_block_scale_factor": 1, "mid_block_type": "UNetMidBlock2DCrossAttn", "norm_eps": 1e-05,
    "norm_num_groups": 32, "num_attention_heads": None, "num_class_embeds": None, "only_cross_attention": False,
    "out_channels": 4, "projection_class_embeddings_input_dim": 2816, "resnet_out_scale_factor": 1.0,
    "resnet_skip_time_act": False, "resnet_time_scale_shift": "default", "sample_size": 128,
    "time_cond_proj_dim": None, "time_embedding_act_fn": None, "time_embedding_dim": None,
    "time_embedding_type": "positional", "timestep_post_act": None, "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], "upcast_attention": None,
    "use_linear_projection": True,
}
VAE_SCALE = 8  # SDXL's VAE: 1024 px -> a 128 x 128 latent


def build_sdxl_unet(device, **config):
    """Random-weight bf16 `UNet2DConditionModel` built on `device`: SDXL base 1.0's UNet config updated by
    `config`."""
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    with torch.device(device):
        return UNet2DConditionModel(**{**SDXL_UNET, **config}).to(torch.bfloat16)


def sdxl_inputs(cfg, device, batch=2, size=1024, text_len=77) -> dict:
    """Forward keywords of one denoising step at `size` px: `batch` latents (2: classifier-free guidance), `text_len`
    text tokens (CLIP-L + bigG hidden states, cross_attention_dim wide), the pooled text embedding and the six time
    ids (original size, crop top-left, target size) of the text_time conditioning."""
    import torch

    bf16 = torch.bfloat16
    latent = size // VAE_SCALE
    pooled = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
    time_ids = torch.tensor([size, size, 0, 0, size, size], device=device, dtype=bf16).repeat(batch, 1)
    return dict(
        sample=torch.randn(batch, cfg.in_channels, latent, latent, device=device, dtype=bf16),
        timestep=torch.tensor(999, device=device),
        encoder_hidden_states=torch.randn(batch, text_len, cfg.cross_attention_dim, device=device, dtype=bf16),
        added_cond_kwargs={"text_embeds": torch.randn(batch, pooled, device=device, dtype=bf16), "time_ids": time_ids},
        return_dict=False)


class DispatchAttnProcessor:
    """diffusers' `AttnProcessor2_0` (the processor of `UNet2DConditionModel`'s `Attention` modules, which calls torch
    SDPA itself) with that call made through diffusers' attention dispatcher, so that `set_attention_backend`
    reaches it. Same computation: spatial / group norm, q / k / v projections, optional q / k norms, the mask as
    AttnProcessor2_0 prepares it ([B, H, Sq|1, Sk] additive), attention, output projection, residual, rescale.
    One instance may serve every module (`set_attn_processor(DispatchAttnProcessor())`)."""

    _attention_backend = None
    _parallel_config = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args,
                 **kwargs):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch_size, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape)
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        head_dim = key.shape[-1] // attn.heads
        # [B, S, H, D]: the dispatcher's layout (AttnProcessor2_0 transposes to [B, H, S, D] for SDPA)
        query = query.view(batch_size, -1, attn.heads, head_dim)
        key = key.view(batch_size, -1, attn.heads, head_dim)
        value = value.view(batch_size, -1, attn.heads, head_dim)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                              is_causal=False, backend=self._attention_backend,
                                              parallel_config=self._parallel_config)
        hidden_states = hidden_states.reshape(batch_size, -1, attn.heads * head_dim).to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def attention_processors(model) -> dict:
    """{processor class name: count} over the model's diffusers `Attention` modules."""
    from diffusers.models.attention_processor import Attention

    counts = {}
    for m in model.modules():
        if isinstance(m, Attention):
            name = type(m.processor).__name__
            counts[name] = counts.get(name, 0) + 1
    return counts


def modules_on_backend(model, backend: str) -> int:
    """How many of the model's attention processors have `backend` selected."""
    from diffusers.models.attention_processor import Attention

    return sum(1 for m in model.modules() if isinstance(m, Attention)
               and str(getattr(getattr(m.processor, "_attention_backend", None), "value", None)) == backend)


SDXL_ROUNDS = 3


def bench_sdxl(reps, *, device="cuda", batch=2, size=1024, text_len=77, rounds=SDXL_ROUNDS, **config):
    """One SDXL UNet denoising step: the model as built (AttnProcessor2_0) vs `DispatchAttnProcessor` on
    window_attn_hub (and on diffusers' native backend), taking turns for `rounds` rounds."""
    import torch
    from diffusers.models.attention_processor import AttnProcessor2_0

    import winattn.integrations.diffusers as wd

    wd.register()
    model = build_sdxl_unet(device, **config).eval()
    if device == "cuda":
        torch.cuda.empty_cache()  # the fp32 construction's blocks
    kw = sdxl_inputs(model.config, device, batch, size, text_len)
    res = {"params_b": sum(p.numel() for p in model.parameters()) / 1e9, "batch": batch, "size": size,
           "latent": list(kw["sample"].shape[-2:]), "text_len": text_len,
           "native_processors": attention_processors(model)}
    outs, runs = {}, {}

    def dispatch(backend):
        model.set_attn_processor(DispatchAttnProcessor())
        model.set_attention_backend(backend)

    setups = {"native": lambda: model.set_attn_processor(AttnProcessor2_0()),
              "window_attn_hub": lambda: dispatch("window_attn_hub"),
              "native_dispatch": lambda: dispatch("native")}
    for _ in range(rounds):
        for label, setup in setups.items():
            setup()
            if label == "native" and attention_processors(model) != res["native_processors"]:
                raise RuntimeError(f"the model as built was not restored: {attention_processors(model)}")
            with torch.no_grad():
                if label not in outs:  # the first round: the output to compare, the modules on the backend
                    outs[label] = model(**kw)[0].float()
                    if label != "native":
                        backend = "native" if label == "native_dispatch" else label
                        res[f"{label}_modules"] = modules_on_backend(model, backend)
                runs.setdefault(label, []).append(timed(lambda: model(**kw), reps, device))
    for label, timings in runs.items():
        res[label] = {"step_ms": statistics.median(t["step_ms"] for t in timings),
                      "rounds_ms": [t["step_ms"] for t in timings]}
        if "peak_gib" in timings[0]:
            res[label]["peak_gib"] = max(t["peak_gib"] for t in timings)
    versus_native(res, outs)
    res["native_dispatch_max_abs_diff"] = (outs["native_dispatch"] - outs["native"]).abs().max().item()
    del model, outs
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------------------------------------------
# Wan 2.1 (diffusers): issue 30's "Wan 1.3B-shaped inference" target

# Wan 2.1 T2V 1.3B's transformer config (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json): 12 heads of 128,
# 30 blocks, UMT5 text of 4096, 1.42 B parameters as diffusers builds it.
WAN_1P3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
                text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
# 480 x 832 px, 81 frames: Wan's VAE makes a 21 x 60 x 104 latent (4x in time after the first frame, 8x in space),
# which (1, 2, 2) patches turn into 21 x 30 x 52 = 32760 tokens; WanPipeline pads the prompt to 512 text tokens.
WAN_LATENT = (21, 60, 104)
WAN_TEXT_LEN = 512


def build_wan(device, **config):
    """Random-weight `WanTransformer3DModel` built on `device`: WAN_1P3B updated by `config`, its parameters in bf16
    except those diffusers keeps in fp32 (`_keep_in_fp32_modules`: time embedding, norms, modulation tables), matched
    by a name component as `from_pretrained(torch_dtype=torch.bfloat16)` does when it loads the weights for users
    (a plain `.to(torch.bfloat16)` would cast those too, which diffusers warns about)."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = WanTransformer3DModel(**{**WAN_1P3B, **config})
    keep = set(model._keep_in_fp32_modules or ())
    for name, param in model.named_parameters():
        param.data = param.data.float() if keep & set(name.split(".")) else param.data.to(torch.bfloat16)
    return model


def wan_inputs(cfg, device, latent=WAN_LATENT, text_len=WAN_TEXT_LEN, batch=1) -> dict:
    """Forward keywords of one denoising call: a [batch, C, F, H, W] latent, the timestep, `text_len` UMT5 states
    (WanPipeline runs the conditional and the unconditional call one after the other, each with batch 1)."""
    import torch

    bf16 = torch.bfloat16
    return dict(hidden_states=torch.randn(batch, cfg.in_channels, *latent, device=device, dtype=bf16),
                timestep=torch.full((batch,), 999, device=device, dtype=torch.long),
                encoder_hidden_states=torch.randn(batch, text_len, cfg.text_dim, device=device, dtype=bf16),
                return_dict=False)


def bench_wan(reps, *, device="cuda", latent=WAN_LATENT, text_len=WAN_TEXT_LEN, **config):
    """One Wan 2.1 transformer call (a denoising step's conditional half), `native` vs `window_attn_hub`
    (set_attention_backend: Wan's attention goes through diffusers' dispatcher), forward only: every block's
    self-attention over all tokens (32760 x 32760, heads of 128, RoPE applied before the call) and its
    cross-attention to the text (32760 x 512)."""
    import torch

    import winattn.integrations.diffusers as wd

    wd.register()
    model = build_wan(device, **config).eval()
    cfg = model.config
    kw = wan_inputs(cfg, device, latent, text_len)
    p_t, p_h, p_w = cfg.patch_size
    tokens = (latent[0] // p_t) * (latent[1] // p_h) * (latent[2] // p_w)
    res = {"params_b": sum(p.numel() for p in model.parameters()) / 1e9, "latent": list(latent),
           "tokens": tokens, "text_len": text_len}
    outs = {}
    with torch.no_grad():
        for backend in ("native", "window_attn_hub"):
            model.set_attention_backend(backend)
            outs[backend] = model(**kw)[0].float()
            res[backend] = timed(lambda: model(**kw), reps, device)
    versus_native(res, outs)
    del model, outs
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


def workloads(args) -> dict:
    """name -> zero-argument callable, in the order they run."""
    runs = {"flux_step": lambda: bench_flux(args.reps),
            "flux_train": lambda: bench_flux_train(args.reps, args.flux_layers)}
    for name, (model_name, batch, img_size) in SWIN.items():
        runs[name] = lambda m=model_name, b=batch, s=img_size: bench_swin(args.reps, m, b, s)
    for name, (model_name, batch, img_size) in BEIT.items():
        runs[name] = lambda m=model_name, b=batch, s=img_size: bench_beit(args.reps, m, b, s)
    runs["sdxl_step"] = lambda: bench_sdxl(args.reps)
    runs["wan_step"] = lambda: bench_wan(args.reps)
    return runs


WORKLOADS = ("flux_step", "flux_train", *SWIN, *BEIT, "sdxl_step", "wan_step")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="build/torch-stable-abi210-cu130-x86_64-linux")
    ap.add_argument("--out", default="results/bench_models.json")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", nargs="*", default=None, choices=WORKLOADS, metavar="NAME",
                    help="subset of: " + " ".join(WORKLOADS))
    ap.add_argument("--flux-layers", nargs=2, type=int, default=None, metavar=("DOUBLE", "SINGLE"),
                    help="flux_train only: this many double / single blocks (full width and heads, so the attention "
                         "calls are the real model's) instead of the full 19 / 38, if the full step does not fit")
    args = ap.parse_args()
    if args.flux_layers is not None and (min(args.flux_layers) < 0 or sum(args.flux_layers) == 0):
        ap.error(f"--flux-layers needs two counts >= 0, not both 0; got {args.flux_layers}")
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
        for name, fn in workloads(args).items():
            if args.only and name not in args.only:
                continue
            try:
                results[name] = fn()
            except Exception as e:  # one model failing still lets the others run; the error is recorded
                results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                if name == "flux_train" and isinstance(e, torch.cuda.OutOfMemoryError):
                    results[name]["hint"] = "rerun with --flux-layers DOUBLE SINGLE (e.g. 10 20)"
            torch.cuda.empty_cache()  # what a failed workload's frames held is free now
            print(name, json.dumps(results[name]), flush=True)
    finally:
        srv.stop()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
