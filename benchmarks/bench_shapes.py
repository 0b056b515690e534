"""The shape matrix of issue 29: our kernel against every peer that computes the same thing, on the attention calls
of real models, all measured in one process.

    python benchmarks/bench_shapes.py --variant build/torch-stable-abi210-cu130-x86_64-linux [--variant-b DIR_B]
        [--b-force NAMES]
        [--out results/bench_shapes.json] [--only SUBSTR ...] [--peers cudnn,fa2,efficient,flex,fa4] [--reps 20]
        [--budget-s 300] [--no-bwd] [--list] [--device cpu] [--kernel-time]

Rows (ROWS; `--list` prints them without touching a GPU): one attention call of a real model each, named by it
(timm ViT / DeiT / EVA-02 / BEiT / MaxViT / Swin, DiT, PixArt-α, SD 1.5, SDXL, SD3, Flux, QwenImage, LTX-Video,
Wan 2.1, CogVideoX, HunyuanVideo, T5, Llama / Mistral prefill and decode), together covering every bias and mask
form the API takes: float terms [1,H,S,S] / [B,H,S,S] / [B,1,1,S] / [B,1,S,S] / [1,H,1,S] in fp32 / bf16 / fp16,
float masks filled with -inf / finfo.min / -10000, bool masks in every broadcast, key padding, causal, sliding
window, GQA, and the Swin table + shift mask. A row gives batch, heads (kv heads), Sq, Sk, D, the q/k/v dtype, its
terms and which need a gradient; a row where nothing needs one is an inference call and is timed forward only.
Masks never hide every key of a query (such rows are opened, as transformers' `_unmask_unattended` does), so
that -inf masks give no NaN in any implementation.

Ours: `attention` (bias and float masks as bias=, bool masks as mask=, key padding, causal, window), or
`window_attention` for the Swin rows (table gathered through the index in the kernel, shift mask).
Peers (PEERS), each on the rows where it computes the same thing:
  cudnn      SDPA's cuDNN backend. Every term folded into one additive attn_mask in q's dtype, made once outside
             the timing. No dBias (PyTorch's cuDNN backward returns none), so on a row whose bias learns it runs with
             the bias detached: it counts for the forward and for fwd+bwd, not for fwd+bwd with dBias.
  fa2        SDPA's flash backend: rows without terms or sliding window; causal via is_causal.
  efficient  SDPA's memory-efficient backend: every row; a learnable term enters inside the timed call (cast to q's
             dtype; a Swin table gathered and materialized at [B, H, N, N]) so that its gradient comes back.
  flex       FlexAttention, torch.compile'd: float terms as a score_mod, bool masks / key padding / causal / window
             as a block mask (create_block_mask, outside the timing); its captured tensors get their gradient.
             Compiled once per row, its compile time recorded as setup_s and never timed; skipped when what is
             left of --budget-s cannot pay its compile plus the later rows. Rows with terms have priority (see
             FlexBudget): without terms Flex is plain attention, ~0.75x cuDNN on the H200, rarely the best peer.
  fa4        FlashAttention-4, flash_attn.cute.flash_attn_func after site.addsitedir("/tmp/fa4/site")
             (../shared/device/fa4_wheels.sh stages it): rows without terms; causal and window_size.
The dBias peers (best_peer_dbias) are efficient and flex. GQA rows: SDPA gets enable_gqa=True, or k/v repeated
inside the call where a backend refuses it (the JSON notes which). A peer that fails on a row gets a one-line
reason in the table and the JSON and is left out of that row's ratios; a row where ours fails counts as below 1.0x.

Timing: CUDA events (bench_cuda.cuda_time: median of --reps after 3 warm-up calls, queued back to back) after
bench_cuda.warm_up_gpu; an SDPA backend is selected once around its timing, not per call (its host cost would
weigh on the decode rows). fwd: the forward as the row calls it (inputs that need a gradient do, as in training).
f+b: ONE timed region, forward + torch.autograd.grad(out, leaves, dout) with a random dout, no retain_graph: what a
training step pays for the call (dBias included where the implementation returns it). The first forward + backward
of each implementation runs untimed; its wall time is setup_s (Flex's compile, FA4's JIT). Inputs: random normal
q/k/v [B, S, H, D] (ours, FA4) and their transposed views [B, H, S, D] (SDPA, Flex), made once per row, fresh per
row (seeded by the row's name). Check: every output is compared with ours; a row's line shows max |ours - best
forward peer| and marks it `!` above 0.05 (bf16) / 0.02 (fp16). The JSON also keeps each timing's host ms per call
(fwd_host_ms, fb_host_ms: the wall time of the queued loop over its calls); where it is close to the event time, the
row reads the host's pace, not the kernels' (benchmarks/kernel_time.py splits the two). A ratio where ours or its
peer is host-paced (host ms >= HOST_PACED x event ms) is marked `(host)`, and the summary counts those among the rows
below 1.0x: it is not the kernels' ratio. Both sides paced: it compares two Python + launch paths, which on rows of
~0.05-0.1 ms the H100 / H200 hosts set (30-100 us per call, bimodal run to run; RESULTS "Thirty-first session"); the
peer alone: its kernels are faster still than the ratio says; ours alone: ours are. With --kernel-time each such
ratio is also measured in kernel time (bench_cuda.device_ms, CUPTI: the device time of every kernel one call
launches), ours and that direction's best peer, shown as `(host; kernels R)`, and the summary adds how many of the
host-paced rows below 1.0x are below it in kernel time too.

With --variant-b the two builds are timed A, B, B, A in each row and each reads the mean of its two medians (the
build timed first in a row read up to 10% faster on the H200, whichever it was: timing_order). --b-force NAMES makes
B the --variant build (or --variant-b's) run with WINATTN_FORCE_KERNEL=NAMES: a kernel A/B without a second build (a
row the forced kernel cannot take shows B's error).
Output: a line per row (ms): ours fwd and f+b; with --variant-b, B's and `B/A` (A's time / B's time, > 1 = B
faster); each peer's fwd/f+b; then ours against the best peer (its time / ours, > 1 = ours faster) for fwd and f+b,
and `dB` against the best peer that returns dBias where the row's bias learns. Then the summary of --variant,
    rows below 1.0x best peer: N of M (fwd), N of M (fwd+bwd); host-paced among them: N (fwd), N (fwd+bwd)
(M = rows where at least one peer ran in that direction) and, with --variant-b, variant B's as the last line,
    variant B: rows below 1.0x best peer: N of M (fwd), N of M (fwd+bwd); host-paced among them: ...
(--variant = the baseline, --variant-b = the new build: both loaded in this process, their op namespaces differ
by build id; the same build twice is loaded once and shows the run-to-run noise). `grep '^rows below'` always
gives --variant's line, `tail -1` the newest build's. Every number, reason and row spec goes to --out (JSON,
rewritten after each row). Progress with elapsed time goes to stderr. The default set with every peer takes about
5 minutes on the H200; --budget-s bounds Flex's compiles, the only open-ended cost.

--device cpu: a dry run of the same code with the CPU build (fp32 q/k/v, every row shrunk by `shrink`, SDPA's math
backend standing in for the three SDPA peers, Flex eager, no FA4): it shows that every row's calls are accepted
and agree; its times mean nothing (tests/unit/test_bench_shapes.py runs it on a few rows).
"""

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cuda as bc  # noqa: E402  (load_kernel, cuda_time, warm_up_gpu)
from bench_models import cpu_time  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FILLS = {"-inf": lambda dt: float("-inf"), "finfo.min": lambda dt: torch.finfo(dt).min, "-10000": lambda dt: -1e4}
CHECK_TOL = {torch.bfloat16: 0.05, torch.float16: 0.02, torch.float32: 1e-3}
PAD_FRACTION = 0.1  # key padding: the last batch item hides this share of its keys, the others proportionally less
FLEX_COMPILE_GUESS_S = 30.0  # Flex's compile before one has been measured (forward + backward, H200 host)


# ------------------------------------------------------------------------------------------------------------------
# The row table

@dataclass(frozen=True)
class Term:
    """One term of a call. `shape` spells its broadcast over [B, H, Sq, Sk] as four letters out of B H Q K, '1'
    where it broadcasts ("1HQK" = [1, H, Sq, Sk]); key padding is "BK" ([B, Sk]); the Swin table and shift mask
    have their own shapes (""). Kinds:
      bias   float, added to the scores (learnable when grad)
      fmask  float mask: 0 where visible, `fill` where hidden
      mask   bool mask, True = attend
      kpm    bool key padding [B, Sk], True = real token
      table  Swin relative-position table [(2W-1)^2, H] fp32, gathered through the index [N, N]
      shift  Swin shift mask [nW, N, N], 0 / -100, window index = batch index mod nW
    `pattern` picks the hidden keys of a mask: pad (trailing keys per batch item), random (20%), docs (block-
    diagonal causal: packed documents), causal_pad (causal with left padding); by default pad for [B,1,1,S] and
    [B,S], docs for [B,1,S,S], random otherwise."""

    kind: str
    shape: str = "1HQK"
    dtype: str = "fp32"
    grad: bool = False
    fill: str = "-inf"
    pattern: str = ""

    def describe(self) -> str:
        if self.kind in ("table", "shift"):
            return {"table": "table[(2W-1)^2,H]", "shift": "shift[nW,N,N]"}[self.kind] + (
                " fp32 grad" if self.grad else "")
        dims = ",".join({"Q": "Sq", "K": "Sk"}.get(c, c) for c in self.shape)
        text = f"{self.kind}[{dims}]"
        if self.kind in ("bias", "fmask"):
            text += f" {self.dtype}"
        if self.kind == "fmask":
            text += f" {self.fill}"
        if self.pattern:
            text += f" {self.pattern}"
        return text + (" grad" if self.grad else "")


def bias(shape="1HQK", dtype="fp32", grad=True):
    return Term("bias", shape, dtype, grad)


def fmask(shape, fill, dtype="bf16", pattern=""):
    return Term("fmask", shape, dtype, fill=fill, pattern=pattern)


def bmask(shape, pattern=""):
    return Term("mask", shape, "bool", pattern=pattern)


KPM = Term("kpm", "BK", "bool")
SWIN = (Term("table", "", "fp32", grad=True), Term("shift", "", "fp32"))


@dataclass(frozen=True)
class Row:
    """One attention call. q [B, Sq, H, D], k / v [B, Sk, Hkv, D] (Hkv = 0: H). For Swin rows B counts windows,
    Sq = Sk = W * W and swin = (W, windows per image)."""

    name: str
    cls: str
    model: str
    B: int
    H: int
    Sq: int
    Sk: int
    D: int
    Hkv: int = 0
    dtype: str = "bf16"
    terms: tuple = ()
    causal: bool = False
    window: Optional[tuple] = None
    qkv_grad: bool = True
    swin: Optional[tuple] = None

    @property
    def hkv(self) -> int:
        return self.Hkv or self.H

    @property
    def learns(self) -> bool:
        """Whether a term (bias or Swin table) needs its gradient."""
        return any(t.grad for t in self.terms)

    @property
    def trains(self) -> bool:
        return self.qkv_grad or self.learns

    def describe_terms(self) -> str:
        parts = [t.describe() for t in self.terms]
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"window{tuple(self.window)}")
        return " + ".join(parts) or "-"


def R(name, cls, model, B, H, Sq, Sk, D, **kw) -> Row:
    return Row(name, cls, model, B, H, Sq, Sk, D, **kw)


# Classes: short (no terms, S <= 1024), long (no terms, S >= 4k), cross (Sk of a text encoder), relbias (a
# learnable or frozen relative-position bias), swin (window_attention), keypad (diffusers' key padding in its
# three forms), mask (the other mask forms), causal (LLM prefill), decode (Sq = 1), dense (plain attention at 16k
# tokens: the FA4 comparison). Rows with terms come first within the image models, so that Flex's budget goes to
# them (FlexBudget).
ROWS = [
    # timm ViT family: many short sequences
    R("vit_b16", "short", "timm vit_base_patch16_224, train batch 128", 128, 12, 197, 197, 64),
    R("deit_s16_fp16", "short", "timm deit_small_patch16_224, AMP fp16 train batch 256", 256, 6, 197, 197, 64,
      dtype="fp16"),
    R("eva02_b14", "short", "timm eva02_base_patch14_224 (rope, no bias), train batch 128", 128, 12, 257, 257, 64),
    R("vit_l16_infer", "short", "timm vit_large_patch16_224, inference batch 256", 256, 16, 197, 197, 64,
      qkv_grad=False),
    # 321-1024 keys at D = 64: where the two-CTA tile's reach ends (kTwoCtasMaxKeys)
    R("vit_b16_384", "short", "timm vit_base_patch16_384 fine-tune (24x24 patches + cls), train batch 64", 64, 12,
      577, 577, 64),
    R("clip_l14_336_infer", "short", "CLIP ViT-L/14-336 image encoder (24x24 + cls), inference batch 128", 128, 16,
      577, 577, 64, qkv_grad=False),
    R("vit_b8_224", "short", "timm vit_base_patch8_224 (28x28 patches + cls), train batch 32", 32, 12, 785, 785, 64),
    R("eva02_b14_448", "short", "timm eva02_base_patch14_448 (32x32 + cls), train batch 16", 16, 12, 1025, 1025,
      64),
    # relative-position biases [1, H, N, N] shared over a large batch
    R("beit_b16_fp32", "relbias", "timm beit_base_patch16_224: rel-pos bias fp32 as attn_mask, train batch 128",
      128, 12, 197, 197, 64, terms=(bias("1HQK", "fp32"),)),
    R("beit_b16_bf16", "relbias", "timm beit_base_patch16_224, bias in bf16, train batch 128", 128, 12, 197, 197,
      64, terms=(bias("1HQK", "bf16"),)),
    R("beit_b16_fp16", "relbias", "timm beit_base_patch16_224, AMP fp16 with an fp16 bias, train batch 128", 128,
      12, 197, 197, 64, dtype="fp16", terms=(bias("1HQK", "fp16"),)),
    R("beit_b16_frozen_bias", "relbias", "timm beit_base_patch16_224 fine-tune, frozen fp32 bias, batch 128", 128,
      12, 197, 197, 64, terms=(bias("1HQK", "fp32", grad=False),)),
    R("beit_l16_infer", "relbias", "timm beit_large_patch16_224, inference batch 256, fp32 bias", 256, 16, 197,
      197, 64, qkv_grad=False, terms=(bias("1HQK", "fp32", grad=False),)),
    R("eva02_b14_keybias", "relbias", "EVA-02-B shape with a learnable per-head key bias [1,H,1,S] bf16", 128, 12,
      257, 257, 64, terms=(bias("1H1K", "bf16"),)),
    R("maxvit_t_block", "relbias", "timm maxvit_tiny_tf_224 stage 1 block attention: 7x7 windows of 56x56, "
      "2 heads x 32, batch 64 (4096 windows), rel-pos bias fp32", 4096, 2, 49, 49, 32, terms=(bias("1HQK"),)),
    R("maxvit_t_grid", "relbias", "timm maxvit_tiny_tf_224 stage 3 grid attention: 7x7 grid over 14x14, 8 heads x "
      "32, batch 128 (512 windows)", 512, 8, 49, 49, 32, terms=(bias("1HQK"),)),
    R("t5_base_enc", "relbias", "T5-base encoder: position bias [1,H,S,S] fp32 with its gradient, batch 32", 32,
      12, 512, 512, 64, terms=(bias("1HQK", "fp32"),)),
    R("t5_base_enc_kpm", "relbias", "T5-base encoder: position bias fp32 (grad) + padded batch (key padding)", 32,
      12, 512, 512, 64, terms=(bias("1HQK", "fp32"), KPM)),
    R("t5_base_bias_bhss", "relbias", "T5-base: position bias + padding summed as transformers does, [B,H,S,S] "
      "bf16 (grad), batch 16", 16, 12, 512, 512, 64, terms=(bias("BHQK", "bf16"),)),
    # Swin: window_attention (table gathered in the kernel, shift mask)
    R("swin_t_w7", "swin", "timm swin_tiny_patch4_window7_224 stage 1 shifted block: 64 windows of 7x7 per image, "
      "3 heads x 32, batch 128", 8192, 3, 49, 49, 32, terms=SWIN, swin=(7, 64)),
    R("swin_b384_w12", "swin", "timm swin_base_patch4_window12_384 stage 1 shifted block: 64 windows of 12x12, "
      "4 heads x 32, batch 64", 4096, 4, 144, 144, 32, terms=SWIN, swin=(12, 64)),
    R("swinv2_b_w16", "swin", "timm swinv2_base_window16_256 stage 1 shifted block: continuous-position bias "
      "[1,H,N,N] fp32 (grad) + shift mask, 16 windows of 16x16, 4 heads x 32, batch 32", 512, 4, 256, 256, 32,
      terms=(bias("1HQK"), SWIN[1]), swin=(16, 16)),
    # DiT / PixArt (D = 72)
    R("dit_xl2_256", "short", "DiT-XL/2 256 px (16x16 patches), train batch 64", 64, 16, 256, 256, 72),
    R("dit_xl2_512", "short", "DiT-XL/2 512 px (32x32 patches), train batch 16", 16, 16, 1024, 1024, 72),
    R("dit_xl2_512_mask_1hqk", "mask", "DiT-XL/2 512 px with a bool per-head mask [1,H,S,S]", 16, 16, 1024, 1024,
      72, terms=(bmask("1HQK"),)),
    R("pixart_a_self_1024", "long", "PixArt-α 1024 px self-attention (64x64 patches), batch 4", 4, 16, 4096, 4096,
      72),
    R("pixart_a_cross_kpm", "cross", "PixArt-α cross-attention to 120 T5 tokens, text padding as key_padding_mask",
      4, 16, 4096, 120, 72, terms=(KPM,)),
    R("pixart_a_cross_fmask", "cross", "PixArt-α cross-attention as diffusers builds its mask: float [B,1,1,Sk] "
      "bf16, (1 - mask) * -10000", 4, 16, 4096, 120, 72, terms=(fmask("B11K", "-10000"),)),
    # SD 1.5 UNet (8 heads, D = 40 / 80 / 160) and SDXL (D = 64)
    R("sd15_self_4096", "long", "SD 1.5 UNet 64x64 level (320 ch), batch 8 (4 prompts x CFG)", 8, 8, 4096, 4096, 40),
    R("sd15_self_1024", "short", "SD 1.5 UNet 32x32 level (640 ch), batch 8", 8, 8, 1024, 1024, 80),
    R("sd15_self_256", "short", "SD 1.5 UNet 16x16 level (1280 ch), batch 8", 8, 8, 256, 256, 160),
    R("sd15_self_64", "short", "SD 1.5 UNet mid block 8x8 (1280 ch), batch 8", 8, 8, 64, 64, 160),
    R("sd15_cross_4096", "cross", "SD 1.5 UNet 64x64 cross-attention to 77 CLIP tokens, batch 8", 8, 8, 4096, 77,
      40),
    R("sd15_cross_4096_fp16", "cross", "SD 1.5 fp16 inference, cross-attention with a float [B,1,1,Sk] fp16 "
      "-10000 text mask (diffusers prepare_attention_mask)", 8, 8, 4096, 77, 40, dtype="fp16", qkv_grad=False,
      terms=(fmask("B11K", "-10000", "fp16"),)),
    R("sd15_cross_1024", "cross", "SD 1.5 UNet 32x32 cross-attention, batch 8", 8, 8, 1024, 77, 80),
    R("sd15_cross_256", "cross", "SD 1.5 UNet 16x16 cross-attention, batch 8", 8, 8, 256, 77, 160),
    R("sd15_cross_64", "cross", "SD 1.5 UNet mid block cross-attention, batch 8", 8, 8, 64, 77, 160),
    R("sdxl_self_4096", "long", "SDXL UNet 64x64 level (640 ch, 10 heads), batch 4", 4, 10, 4096, 4096, 64),
    R("sdxl_self_1024", "short", "SDXL UNet 32x32 level (1280 ch, 20 heads), batch 4", 4, 20, 1024, 1024, 64),
    R("sdxl_cross_4096", "cross", "SDXL 64x64 cross-attention to 77 tokens, batch 4", 4, 10, 4096, 77, 64),
    R("sdxl_cross_1024", "cross", "SDXL 32x32 cross-attention to 77 tokens, batch 4", 4, 20, 1024, 77, 64),
    R("sdxl_cross_mask_11qk", "mask", "SDXL 32x32 cross-attention with a regional-prompt bool mask [1,1,Sq,Sk]", 4,
      20, 1024, 77, 64, terms=(bmask("11QK"),)),
    R("vit_b16_mask_1h1k", "mask", "ViT-B/16 shape with a bool per-head key mask [1,H,1,S] (token dropping)", 128,
      12, 197, 197, 64, terms=(bmask("1H1K"),)),
    R("t5_base_mask_bhqk", "mask", "T5-base shape with a bool [B,H,S,S] mask", 32, 12, 512, 512, 64,
      terms=(bmask("BHQK"),)),
    # MMDiT / video DiTs: long joint sequences, diffusers' key padding forms
    R("sd3_m_joint", "long", "SD3-medium 1024 px joint attention: 4096 image + 77 CLIP + 256 T5 tokens (diffusers' "
      "default max_sequence_length), 24 heads", 2, 24, 4429, 4429, 64),
    R("flux1_joint", "long", "Flux.1 1024 px: 4096 image + 512 text tokens", 1, 24, 4608, 4608, 128),
    R("flux1_fmask_b11k", "keypad", "Flux.1 1024 px, batch 2, float additive key padding [B,1,1,S] bf16 -inf", 2,
      24, 4608, 4608, 128, terms=(fmask("B11K", "-inf"),)),
    R("qwen_image_kpm", "keypad", "QwenImage 1024 px joint attention, batch 2, text padding as key_padding_mask",
      2, 24, 4352, 4352, 128, terms=(KPM,)),
    R("qwen_image_mask_b11k", "keypad", "QwenImage as diffusers passes it: bool [B,1,1,S] attn_mask", 2, 24, 4352,
      4352, 128, terms=(bmask("B11K"),)),
    R("hunyuan_video_fmask", "keypad", "HunyuanVideo 544x960, 53 frames: 14x34x60 video + 256 text tokens, float "
      "key padding [B,1,1,S] fp32 finfo.min", 1, 24, 28816, 28816, 128, terms=(fmask("B11K", "finfo.min", "fp32"),)),
    R("ltx_video_cross_fmask", "cross", "LTX-Video cross-attention: 6144 video tokens to 128 text tokens, float "
      "mask [B,H,1,Sk] bf16 -10000", 2, 32, 6144, 128, 64, terms=(fmask("BH1K", "-10000"),)),
    R("cogvideox_2b", "long", "CogVideoX-2B 49 frames 480x720: 13x30x45 video + 226 text tokens", 1, 30, 17776,
      17776, 64),
    R("wan21_1p3b", "long", "Wan 2.1 T2V 1.3B 480p 81 frames: 21x30x52 tokens", 1, 12, 32760, 32760, 128),
    R("wan21_1p3b_cross", "cross", "Wan 2.1 1.3B cross-attention to 512 umT5 tokens", 1, 12, 32760, 512, 128),
    # LLMs: causal GQA prefill, sliding window, packed documents, transformers' 4-D float mask, decode
    R("llama3_8b_prefill", "causal", "Llama-3-8B prefill / training: causal, 32 q / 8 kv heads, batch 2", 2, 32,
      8192, 8192, 128, Hkv=8, causal=True),
    R("mistral_7b_swa", "causal", "Mistral-7B sliding window 4096: causal, window (4096, 0), 32 / 8 heads", 1, 32,
      16384, 16384, 128, Hkv=8, causal=True, window=(4096, 0)),
    R("llama3_8b_docs_b1qk", "mask", "Llama-3-8B packed-sequence training: bool block-diagonal causal document "
      "mask [B,1,S,S]", 4, 32, 4096, 4096, 128, Hkv=8, terms=(bmask("B1QK", "docs"),)),
    R("llama3_8b_hf_fmask_b1qk", "mask", "Llama-3-8B through transformers' 4-D float mask: causal + left padding "
      "[B,1,S,S] bf16 finfo.min", 4, 32, 2048, 2048, 128, Hkv=8,
      terms=(fmask("B1QK", "finfo.min", pattern="causal_pad"),)),
    R("llama3_8b_decode", "decode", "Llama-3-8B decode: 1 query, 8192 cached keys, 32 / 8 heads", 1, 32, 1, 8192,
      128, Hkv=8, qkv_grad=False),
    R("llama3_8b_decode_b32", "decode", "Llama-3-8B decode, batch 32", 32, 32, 1, 8192, 128, Hkv=8,
      qkv_grad=False),
    R("llama3_8b_decode_b32_kpm", "decode", "Llama-3-8B decode, batch 32 with ragged cache lengths (key padding)",
      32, 32, 1, 8192, 128, Hkv=8, qkv_grad=False, terms=(KPM,)),
    # plain long attention at the three tile head dims, no terms: issue 30's FA4 comparison (bench_fwd.py's
    # nobias_* workloads, here so that FA4 runs beside them in the same process)
    R("dense_d64_16k", "dense", "plain attention S = 16k, D = 64 (issue 30)", 2, 16, 16384, 16384, 64),
    R("dense_d128_16k", "dense", "plain attention S = 16k, D = 128 (issue 30)", 2, 16, 16384, 16384, 128),
    R("dense_d256_16k", "dense", "plain attention S = 16k, D = 256, 8 heads (issue 30)", 2, 8, 16384, 16384, 256),
    R("dense_causal_d128_16k", "dense", "causal attention S = 16k, D = 128 (issue 30)", 2, 16, 16384, 16384, 128,
      causal=True),
]
CLASSES = ("short", "long", "cross", "relbias", "swin", "keypad", "mask", "causal", "decode", "dense")


def row_problems(row: Row) -> list:
    """What makes a row's call invalid for ours or its peers (empty when consistent)."""
    bad = []
    dims = {"B": row.B, "H": row.H, "Q": row.Sq, "K": row.Sk}
    if row.cls not in CLASSES:
        bad.append(f"class {row.cls!r} not in {CLASSES}")
    if row.D % 8 or not 8 <= row.D <= 256:
        bad.append(f"D = {row.D}: a multiple of 8 in [8, 256]")
    if row.H % row.hkv:
        bad.append(f"H = {row.H} is not a multiple of Hkv = {row.hkv}")
    if row.dtype not in ("bf16", "fp16"):
        bad.append(f"q/k/v dtype {row.dtype}: bf16 or fp16")
    kinds = [t.kind for t in row.terms]
    if len(set(kinds)) != len(kinds):
        bad.append(f"a term kind twice: {kinds}")
    if row.swin is None and sum(k in ("bias", "fmask") for k in kinds) > 1:
        bad.append("attention takes one float term (bias=)")
    for t in row.terms:
        if t.kind in ("table", "shift"):
            if row.swin is None:
                bad.append(f"{t.kind} needs swin=(W, nW)")
            continue
        if t.kind == "kpm":
            if t.shape != "BK":
                bad.append("key padding is [B, Sk] ('BK')")
            continue
        if len(t.shape) != 4 or any(c not in ("1", "BHQK"[i]) for i, c in enumerate(t.shape)):
            bad.append(f"{t.kind} shape {t.shape!r}: per dim '1' or its own letter of BHQK")
        if t.kind == "mask" and t.dtype != "bool":
            bad.append("a bool mask has dtype bool")
        if t.kind in ("bias", "fmask") and t.dtype not in DTYPES:
            bad.append(f"{t.kind} dtype {t.dtype}")
        if t.kind == "fmask" and t.fill not in FILLS:
            bad.append(f"fill {t.fill!r} not in {list(FILLS)}")
        if t.grad and t.kind != "bias":
            bad.append(f"{t.kind} cannot learn")
        if t.pattern in ("docs", "causal_pad") and (row.Sq != row.Sk or t.shape[2:] != "QK"):
            bad.append(f"pattern {t.pattern} needs Sq == Sk and a [.., Sq, Sk] mask")
        if any(dims[c] < 1 for c in t.shape if c != "1"):
            bad.append("empty dim")
    if row.swin is not None:
        W, nW = row.swin
        if row.Sq != W * W or row.Sk != W * W or row.B % nW or row.hkv != row.H:
            bad.append(f"swin {row.swin}: Sq = Sk = W^2, B a multiple of nW, no GQA")
        if not any(t.kind == "shift" for t in row.terms):
            bad.append("a Swin row has its shift mask")
    if (row.causal or row.window is not None) and row.Sq != row.Sk:
        bad.append("causal / window rows have Sq == Sk (SDPA's is_causal is top-left aligned, ours bottom-right)")
    if row.window is not None and (len(row.window) != 2 or not all(isinstance(s, int) for s in row.window)):
        bad.append(f"window {row.window!r}: (left, right) ints")
    if row.Sq == 1 and row.causal:
        bad.append("decode rows are not causal (one query sees every key)")
    return bad


def shrink(row: Row) -> Row:
    """The same call at a size the CPU runs in well under a second (the dry run): same terms, GQA ratio and head
    dim; Swin rows keep their window and shrink to one image."""
    if row.swin is not None:
        return replace(row, B=row.swin[1], H=min(row.H, 2))
    h = min(row.H, 4)
    hkv = max(1, h * row.hkv // row.H)
    if row.Sq == row.Sk:
        sq = sk = min(row.Sq, 80)
    else:
        sq, sk = min(row.Sq, 80), min(row.Sk, 96)
    window = None if row.window is None else tuple(s if s < 0 else min(s, sk // 4) for s in row.window)
    return replace(row, B=min(row.B, 2), H=h, Hkv=hkv if hkv != h else 0, Sq=sq, Sk=sk, window=window)


def list_table(rows) -> str:
    """--list: the rows as a table, and their count by class."""
    out = [f"{'row':<26}{'class':<9}{'B':>6}{'H/Hkv':>7}{'Sq':>7}{'Sk':>7}{'D':>5} {'dtype':<5} {'grad':<11}terms"]
    for r in rows:
        heads = f"{r.H}/{r.hkv}" if r.hkv != r.H else str(r.H)
        grad = "+".join(["qkv"] * r.qkv_grad + ["bias"] * r.learns) or "none (fwd)"
        out.append(f"{r.name:<26}{r.cls:<9}{r.B:>6}{heads:>7}{r.Sq:>7}{r.Sk:>7}{r.D:>5} {r.dtype:<5} {grad:<11}"
                   f"{r.describe_terms()}")
        out.append(f"{'':<26}{r.model}")
    counts = ", ".join(f"{c} {sum(r.cls == c for r in rows)}" for c in CLASSES)
    out.append(f"{len(rows)} rows: {counts}")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------------------------
# Inputs

def term_shape(t: Term, row: Row) -> tuple:
    dims = {"B": row.B, "H": row.H, "Q": row.Sq, "K": row.Sk, "1": 1}
    return tuple(dims[c] for c in t.shape)


def visible_keys(t: Term, row: Row, device) -> torch.Tensor:
    """Bool, True = visible, in the term's own shape ([B, Sk] for key padding, else 4-D)."""
    shape = term_shape(t, row)
    pattern = t.pattern or {"B11K": "pad", "BK": "pad", "B1QK": "docs"}.get(t.shape, "random")
    S = shape[-1]
    if pattern == "pad":
        hidden = torch.tensor([round(S * PAD_FRACTION * (b + 1) / shape[0]) for b in range(shape[0])],
                              device=device)
        vis = (torch.arange(S, device=device)[None] < (S - hidden)[:, None]).reshape(shape)
    elif pattern == "random":
        vis = torch.rand(shape, device=device) > 0.2
    else:  # docs / causal_pad: [B, 1, S, S]
        i = torch.arange(S, device=device)[:, None]
        j = torch.arange(S, device=device)[None, :]
        if pattern == "docs":  # 4 documents per sequence, cut at random places
            cuts = torch.sort(torch.randint(1, S, (shape[0], 3), device=device), dim=1).values
            doc = (torch.arange(S, device=device)[None, :, None] >= cuts[:, None, :]).sum(-1)  # [B, S]
            vis = (doc[:, :, None] == doc[:, None, :]) & (j <= i)
        else:  # left padding of 0 .. 10% per batch item
            pad = torch.randint(0, max(1, S // 10), (shape[0],), device=device)
            vis = (j <= i) & (j >= pad[:, None, None])
        vis = vis[:, None]
    return vis | ~vis.any(-1, keepdim=True)  # no query without a visible key


def swin_index(W: int, device) -> torch.Tensor:
    """timm's relative_position_index [N, N] of a W x W window."""
    coords = torch.stack(torch.meshgrid(torch.arange(W), torch.arange(W), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (W - 1)
    return (rel[..., 0] * (2 * W - 1) + rel[..., 1]).to(device)


def make_inputs(row: Row, device, dtype=None) -> dict:
    """q, k, v and one tensor per term kind (plus the Swin index), random normal, on `device`."""
    dt = dtype or DTYPES[row.dtype]
    x = {"q": torch.randn(row.B, row.Sq, row.H, row.D, device=device, dtype=dt)}
    x["k"], x["v"] = (torch.randn(row.B, row.Sk, row.hkv, row.D, device=device, dtype=dt) for _ in range(2))
    for name in "qkv":
        x[name].requires_grad_(row.qkv_grad)
    for t in row.terms:
        if t.kind == "bias":
            x["bias"] = torch.randn(term_shape(t, row), device=device).to(DTYPES[t.dtype]).requires_grad_(t.grad)
        elif t.kind == "fmask":
            tdt = DTYPES[t.dtype]
            hidden = torch.full((), FILLS[t.fill](tdt), device=device, dtype=tdt)
            x["fmask"] = torch.where(visible_keys(t, row, device), torch.zeros((), device=device, dtype=tdt), hidden)
        elif t.kind in ("mask", "kpm"):
            x[t.kind] = visible_keys(t, row, device)
        elif t.kind == "table":
            W = row.swin[0]
            x["table"] = (torch.randn((2 * W - 1) ** 2, row.H, device=device) * 0.02).requires_grad_(t.grad)
            x["index"] = swin_index(W, device)
        elif t.kind == "shift":
            region = torch.randint(0, 4, (row.swin[1], row.Sq), device=device)
            x["shift"] = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)
    return x


def learnable(x: dict) -> Optional[torch.Tensor]:
    """The term whose gradient the row asks for (bias or Swin table), or None."""
    return next((x[n] for n in ("bias", "table") if n in x and x[n].requires_grad), None)


def grad_leaves(x: dict, learn) -> list:
    """The tensors a row's backward differentiates: q, k, v where they require grad, and the learnable term."""
    return [t for t in (x["q"], x["k"], x["v"], learn) if t is not None and t.requires_grad]


def gather_table(table, index):
    """[(2W-1)^2, H] table -> [1, H, N, N] bias."""
    return table[index].permute(2, 0, 1)[None]


def position_visible(row: Row, q, k):
    """Causal / sliding window as a predicate of query and key positions (tensors), bottom-right aligned as ours;
    None when the row has neither. SDPA gets it as a tensor, Flex as its mask_mod."""
    d = k - q - (row.Sk - row.Sq)
    left, right = row.window or (-1, -1)
    right = 0 if row.causal else right
    vis = None
    for ok in ([d <= right] if right >= 0 else []) + ([d >= -left] if left >= 0 else []):
        vis = ok if vis is None else vis & ok
    return vis


def position_mask(row: Row, device) -> Optional[torch.Tensor]:
    """position_visible as bool [1, 1, Sq, Sk]."""
    vis = position_visible(row, torch.arange(row.Sq, device=device)[:, None], torch.arange(row.Sk, device=device))
    return None if vis is None else vis[None, None]


# ------------------------------------------------------------------------------------------------------------------
# Implementations: ours and the peers. Each call returns (fwd, context, note): fwd() -> out [B, Sq, H, D] (a view
# for the [B, H, S, D] peers), the context to run it in, and a note for the JSON.

@contextlib.contextmanager
def scoped_env(values: dict):
    """`values` set in os.environ inside the block, the old values back after it (the CUDA planner reads its
    WINATTN_* knobs on every call: kernel-src/cuda/host_env.h)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ours_call(kern, row: Row, x: dict, learn, device, env=None):
    """env: knobs set while this build is timed (--b-force)."""
    ctx = partial(scoped_env, env) if env else contextlib.nullcontext
    if row.swin is not None:
        kw = dict(rel_pos_table=x.get("table"), rel_pos_index=x.get("index"), bias=x.get("bias"),
                  mask=x.get("shift"))
        return (lambda: kern.window_attention(x["q"], x["k"], x["v"], **kw)), ctx, None
    kw = dict(bias=x.get("bias", x.get("fmask")), mask=x.get("mask"), key_padding_mask=x.get("kpm"),
              causal=row.causal, window=row.window)
    return (lambda: kern.attention(x["q"], x["k"], x["v"], **kw)), ctx, None


def sdpa_terms(row: Row, x: dict, learn):
    """The row's terms as SDPA's one attn_mask: (mask() -> tensor or None, is_causal). Everything constant is folded
    once into an additive tensor in q's dtype (the cheapest form for every backend: no bool conversion per call);
    the learnable term (`learn`) is added inside the call so that its gradient flows."""
    dt, device = x["q"].dtype, x["q"].device
    const = [x[n].detach() for n in ("bias", "fmask") if n in x and x[n] is not learn]
    if "table" in x and x["table"] is not learn:
        const.append(gather_table(x["table"].detach(), x["index"]))
    if "shift" in x:
        const.append(x["shift"].repeat(row.B // x["shift"].shape[0], 1, 1)[:, None])
    hide = [x["mask"]] if "mask" in x else []
    if "kpm" in x:
        hide.append(x["kpm"][:, None, None, :])
    is_causal = row.causal and row.window is None and not (const or hide or learn is not None)
    position = None if is_causal else position_mask(row, device)
    if position is not None:
        hide.append(position)
    if hide:
        vis = hide[0]
        for h in hide[1:]:
            vis = vis & h
        const.append(torch.where(vis, 0.0, float("-inf")))
    c = None
    if const:
        c = const[0].float()
        for t in const[1:]:
            c = c + t.float()
        c = c.to(dt)
    if learn is None:
        return (lambda: c), is_causal
    as_bias = (lambda: gather_table(learn, x["index"])) if "table" in x and x["table"] is learn else (lambda: learn)
    return (lambda: as_bias().to(dt) if c is None else as_bias().to(dt) + c), is_causal


def sdpa_call(backend):
    def call(row: Row, x: dict, learn, device):
        qt, kt, vt = (x[n].transpose(1, 2) for n in "qkv")
        mask, is_causal = sdpa_terms(row, x, learn)
        ctx = (lambda: sdpa_kernel(backend)) if device == "cuda" else contextlib.nullcontext
        g = row.H // row.hkv

        def run(k, v, gqa):
            return F.scaled_dot_product_attention(qt, k, v, attn_mask=mask(), is_causal=is_causal,
                                                  enable_gqa=gqa).transpose(1, 2)

        if g == 1:
            return (lambda: run(kt, vt, False)), ctx, None
        try:
            with ctx():
                run(kt, vt, True)
            return (lambda: run(kt, vt, True)), ctx, "GQA: enable_gqa=True"
        except RuntimeError as e:
            why = one_line(e)
        return (lambda: run(kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1), False)), ctx, \
            f"GQA: k/v repeated in the call (enable_gqa refused: {why})"

    return call


_FLEX = {}


def squeezed(t):
    """(view of `t` without its size-1 dims, which of b, h, q, k index it): Flex's score_mod / mask_mod then index
    with tensors only, the form bench_cuda's Flex workloads use (a view of a learnable bias gets its gradient)."""
    keep = tuple(n > 1 for n in t.shape)
    return t[tuple(slice(None) if k else 0 for k in keep)], keep


def at(view, keep, b, h, q, k):
    return view[tuple(i for i, use in zip((b, h, q, k), keep) if use)]


def flex_call(row: Row, x: dict, learn, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:  # one compiled wrapper; torch._dynamo.reset() after each row drops its graphs
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False) if device == "cuda" else flex_attention
    if device != "cuda":  # eager Flex on the CPU has no backward: the dry run checks its forward
        x, learn = {n: t.detach() for n, t in x.items()}, None
    floats = [squeezed(t if t is learn else t.detach()) for t in (x.get("bias"), x.get("fmask")) if t is not None]
    table = None if "table" not in x else (x["table"] if x["table"] is learn else x["table"].detach())
    index, shift = x.get("index"), x.get("shift")
    nW = None if shift is None else shift.shape[0]

    def score_mod(score, b, h, q, k):
        for view, keep in floats:
            score = score + at(view, keep, b, h, q, k)
        if table is not None:
            score = score + table[index[q, k], h]
        if shift is not None:
            score = score + shift[b % nW, q, k]
        return score

    preds, per_b, per_h = [], False, False
    if "mask" in x:
        m, keep = squeezed(x["mask"])
        preds.append(lambda b, h, q, k: at(m, keep, b, h, q, k))
        per_b, per_h = keep[0], keep[1]
    if "kpm" in x:
        kpm = x["kpm"]
        preds.append(lambda b, h, q, k: kpm[b, k])
        per_b = True
    if row.causal or row.window is not None:
        preds.append(lambda b, h, q, k: position_visible(row, q, k))

    def mask_mod(b, h, q, k):
        ok = preds[0](b, h, q, k)
        for p in preds[1:]:
            ok = ok & p(b, h, q, k)
        return ok

    block_mask = None if not preds else create_block_mask(mask_mod, row.B if per_b else None,
                                                          row.H if per_h else None, row.Sq, row.Sk, device=device)
    qt, kt, vt = (x[n].transpose(1, 2) for n in "qkv")
    sm = score_mod if (floats or table is not None or shift is not None) else None
    fa, gqa = _FLEX["fn"], row.hkv != row.H
    return (lambda: fa(qt, kt, vt, score_mod=sm, block_mask=block_mask, enable_gqa=gqa).transpose(1, 2)), \
        contextlib.nullcontext, None


# FA4's import lives in bench_cuda (bench_fwd.py and bench_cuda.py time it too): tried once per process.
fa4_import = bc.fa4_import


def fa4_takes(row: Row) -> Optional[str]:
    why = no_terms("FA4 (flash_attn_func)")(row)
    if why is None and not torch.cuda.is_available():
        return "FA4 needs CUDA"
    return why or fa4_import()[1]


def fa4_call(row: Row, x: dict, learn, device):
    kw = {"causal": row.causal}
    if row.window is not None:
        kw["window_size"] = tuple(None if s < 0 else s for s in row.window)
    return (lambda: bc.fa4_attention(x["q"], x["k"], x["v"], **kw)), contextlib.nullcontext, None


def no_terms(what):
    def takes(row: Row) -> Optional[str]:
        if row.terms:
            return f"{what} takes no bias or mask"
        return None

    return takes


def fa2_takes(row: Row) -> Optional[str]:
    if row.window is not None:
        return "SDPA has no sliding window"
    return no_terms("SDPA flash")(row)


@dataclass(frozen=True)
class Peer:
    """A peer: whether its backward returns dBias, why it does not compute a row (None: it does), its call."""

    name: str
    dbias: bool
    takes: Callable[[Row], Optional[str]]
    call: Callable


PEERS = [
    Peer("cudnn", False, lambda row: None, sdpa_call(SDPBackend.CUDNN_ATTENTION)),
    Peer("fa2", False, fa2_takes, sdpa_call(SDPBackend.FLASH_ATTENTION)),
    Peer("efficient", True, lambda row: None, sdpa_call(SDPBackend.EFFICIENT_ATTENTION)),
    Peer("flex", True, lambda row: None, flex_call),
    Peer("fa4", False, fa4_takes, fa4_call),
]


# ------------------------------------------------------------------------------------------------------------------
# Measuring

def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def measure(call, leaves, reps, device):
    """(record, out): setup_s (first forward + backward, untimed), fwd_ms, fb_ms (one region: forward +
    autograd.grad) when there are leaves. `call` = (fwd, context, note)."""
    fwd, ctx, note = call
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    timer = bc.cuda_time if device == "cuda" else partial(cpu_time, warmup=0)
    rec = {"note": note} if note else {}
    with ctx():
        t0 = time.perf_counter()
        out = fwd()
        dout = torch.randn_like(out) if leaves else None
        if leaves:
            torch.autograd.grad(out, leaves, dout)
        sync()
        rec["setup_s"] = time.perf_counter() - t0
        rec["fwd_ms"] = timer(fwd, reps)
        if device == "cuda":  # the host's pace in the same loop: a row whose events read it is host-paced
            rec["fwd_host_ms"] = bc.HOST_MS[-1]
        if leaves:
            rec["fb_ms"] = timer(lambda: torch.autograd.grad(fwd(), leaves, dout), reps)
            if device == "cuda":
                rec["fb_host_ms"] = bc.HOST_MS[-1]
    return rec, out.detach()


def attempt(make_call, leaves, opt):
    """measure(make_call(), ...); a failure, in building the call or in running it, becomes ({"error": one line},
    None) (asynchronous CUDA errors surface here too)."""
    try:
        rec, out = measure(make_call(), leaves, opt.reps, opt.device)
        if opt.device == "cuda":
            torch.cuda.synchronize()
        return rec, out
    except Exception as e:  # a peer (or ours) that cannot run a row is reported, not fatal
        if opt.device == "cuda":
            torch.cuda.empty_cache()
        return {"error": one_line(e)}, None


class FlexBudget:
    """Whether Flex's compile fits into what is left of --budget-s: its compile time (the median measured so far)
    plus the other implementations' time for every later row, and, on a row without terms, Flex's compile for
    every later row with terms (where it is a score_mod / dBias peer, not a slower plain attention)."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds
        self.compile_s, self.other_s = [], []

    def why_not(self, row: Row, later: list) -> Optional[str]:
        compile_s = statistics.median(self.compile_s) if self.compile_s else FLEX_COMPILE_GUESS_S
        other = statistics.mean(self.other_s) if self.other_s else 2.0
        keep = other * len(later) + (0.0 if row.terms else compile_s * sum(bool(r.terms) for r in later))
        left = self.end - time.perf_counter()
        if left < compile_s + keep:
            return (f"budget: {left:.0f} s left, Flex's compile ~{compile_s:.0f} s + {keep:.0f} s kept for the "
                    f"{len(later)} later rows")
        return None


@dataclass
class Options:
    reps: int = 20
    device: str = "cuda"
    bwd: bool = True
    budget: Optional[FlexBudget] = None  # None: Flex always runs (CPU dry run)
    fwd_only: tuple = ()  # peers timed forward only (the CPU dry run's eager Flex)
    env: dict = field(default_factory=dict)  # label -> knobs set while that build is timed (--b-force)
    kernel_time: bool = False  # --kernel-time: host-paced ratios also in kernel time (kernel_ratios)
    log: Callable = lambda msg: None


def timing_order(labels: list) -> list:
    """The order ours are timed in, after a discarded warm-up run of the first (run_row): A, B, B, A with two builds.
    On the H200 the first timed run of a row read 5-10% faster than every later one, whichever build it was (RESULTS
    v3.8; v4.3, the same code in A and B: QwenImage key padding forward 0.775 ms first, then 0.83-0.86; Wan 10.46,
    then 10.58-11.46; the runs after a burst of forward + backward are the slow ones). Without the warm-up run that
    favoured ours against the peers (always timed after ours) and A against B; with it every timed run follows a
    burst, and A, B, B, A cancels a drift along the row."""
    return labels + labels[::-1] if len(labels) == 2 else labels


def merge_runs(recs: list) -> dict:
    """One record from a build's timings in timing_order: the mean of its medians (each run's kept under "runs");
    an error in any run is the record."""
    errors = [r for r in recs if "error" in r]
    if errors or len(recs) == 1:
        return errors[0] if errors else recs[0]
    rec = dict(recs[0])
    keys = ("fwd_ms", "fb_ms", "fwd_host_ms", "fb_host_ms")
    for key in keys:
        if key in rec:
            rec[key] = statistics.mean(r[key] for r in recs)
    rec["runs"] = [{k: r[k] for k in keys if k in r} for r in recs]
    return rec


def run_row(row: Row, kerns: dict, peers: list, opt: Options, later=()) -> dict:
    """Every implementation on one row; the row's result (JSON-ready)."""
    t_row = time.perf_counter()
    res = {"name": row.name, "class": row.cls, "model": row.model, "spec": asdict(row), "impls": {}, "peers": {}}
    torch.manual_seed(zlib.crc32(row.name.encode()))
    x = make_inputs(row, opt.device, None if opt.device == "cuda" else torch.float32)
    learn = learnable(x)
    qkv = [x[n] for n in "qkv"] if row.qkv_grad and opt.bwd else []
    outs, flex_s = {}, 0.0
    leaves = qkv + ([learn] if learn is not None and opt.bwd else [])
    runs = {label: [] for label in kerns}
    first = next(iter(kerns))  # the discarded warm-up run (timing_order says why)
    attempt(partial(ours_call, kerns[first], row, x, learn, opt.device, opt.env.get(first)), leaves, opt)
    for label in timing_order(list(kerns)):
        rec, out = attempt(partial(ours_call, kerns[label], row, x, learn, opt.device, opt.env.get(label)), leaves,
                           opt)
        runs[label].append(rec)
        outs.setdefault(label, out)
        opt.log(f"  {label}: {brief(rec)}")
    for label, recs in runs.items():
        res["impls"][label] = merge_runs(recs)
    for peer in peers:
        why = peer.takes(row)
        if why is None and peer.name == "flex" and opt.budget is not None:
            why = opt.budget.why_not(row, later)
        if why is not None:
            res["peers"][peer.name] = {"skipped": why}
            continue
        bwd = opt.bwd and peer.name not in opt.fwd_only
        dbias = peer.dbias and learn is not None and bwd
        leaves = (qkv if bwd else []) + ([learn] if dbias else [])
        t0 = time.perf_counter()
        rec, outs[peer.name] = attempt(partial(peer.call, row, x, learn if dbias else None, opt.device), leaves, opt)
        if "fwd_ms" in rec:
            rec["dbias"] = dbias
        res["peers"][peer.name] = rec
        opt.log(f"  {peer.name}: {brief(rec)}")
        if peer.name == "flex" and opt.device == "cuda":
            flex_s = time.perf_counter() - t0
            if "setup_s" in rec and opt.budget is not None:
                opt.budget.compile_s.append(rec["setup_s"])
            torch._dynamo.reset()  # drop this row's graphs and the tensors they captured
    ref = outs.get("ours")
    for name, out in outs.items():
        rec = res["impls"].get(name) or res["peers"][name]
        if out is not None and ref is not None and name != "ours":
            rec["max_abs_diff"] = (out.float() - ref.float()).abs().max().item()
    compare(res, list(kerns), row.learns and opt.bwd, CHECK_TOL[x["q"].dtype])
    if opt.kernel_time and opt.device == "cuda":
        by_name = {p.name: p for p in peers}

        def make_call(name):  # (call maker, leaves) as the row's event timing had them
            if name in kerns:
                return (partial(ours_call, kerns[name], row, x, learn, opt.device, opt.env.get(name)),
                        qkv + ([learn] if learn is not None and opt.bwd else []))
            dbias = by_name[name].dbias and learn is not None and opt.bwd
            return (partial(by_name[name].call, row, x, learn if dbias else None, opt.device),
                    qkv + ([learn] if dbias else []))

        kernel_ratios(res, list(kerns), lambda name, d: kernel_ms(*make_call(name), d, opt.reps))
    del x, outs, ref
    if opt.device == "cuda":
        torch.cuda.empty_cache()
    if opt.budget is not None:
        opt.budget.other_s.append(time.perf_counter() - t_row - flex_s)
    return res


def brief(rec: dict) -> str:
    if "error" in rec:
        return "error: " + rec["error"]
    fb = f", f+b {rec['fb_ms']:.3f} ms" if "fb_ms" in rec else ""
    return f"setup {rec['setup_s']:.1f} s, fwd {rec['fwd_ms']:.3f} ms{fb}"


HOST_PACED = 0.9  # a timing whose host ms per call is at least this share of its event ms reads the host's pace


def host_paced(rec: dict, key: str) -> bool:
    """Whether the timing `key` of `rec` (fwd_ms / fb_ms) read the host's pace: the host took about as long to issue
    a call as the events measured (cuda_time queues the calls back to back, so a host slower than the kernels shows
    up as the event time). Records without host ms (the CPU dry run) are not."""
    ms, host = rec.get(key), rec.get(key.replace("_ms", "_host_ms"))
    return bool(ms) and host is not None and host >= HOST_PACED * ms


def fb_step(fwd, leaves):
    """The f+b region measure() times, for the kernel-time tools: forward + torch.autograd.grad(out, leaves, dout),
    dout random and fixed (made from one forward here)."""
    dout = torch.randn_like(fwd())
    return lambda: torch.autograd.grad(fwd(), leaves, dout)


def kernel_ms(make_call, leaves, d: str, reps: int) -> float:
    """The summed device time of the kernels one call launches (bench_cuda.device_ms, CUPTI): the forward (d = "fwd")
    or forward + autograd.grad (d = "fb", fb_step), as measure() times them."""
    fwd, ctx, _ = make_call()
    with ctx():
        return bc.device_ms(fwd if d == "fwd" else fb_step(fwd, leaves), reps)[0]


def kernel_ratios(res: dict, labels: list, measure: Callable[[str, str], float]) -> None:
    """For each host-paced forward / f+b ratio of res (compare's host_paced), the same ratio in kernel time:
    measure(name, d) -> ms for ours (a label) and for that direction's best peer; into res["kernel_ms"] (name ->
    d -> ms) and res["vs_best_kernels"] (label -> d -> peer's / ours). A failure is recorded, not raised."""
    res["kernel_ms"], res["vs_best_kernels"] = {}, {}
    for label in labels:
        ratios = {}
        for d in (d for d in res.get("host_paced", {}).get(label, []) if d in ("fwd", "fb")):
            try:
                times = {}
                for name in (label, res["best_peer"][d]):
                    times[name] = res["kernel_ms"].setdefault(name, {}).get(d) or measure(name, d)
                    res["kernel_ms"][name][d] = times[name]
                ratios[d] = times[res["best_peer"][d]] / times[label]
            except Exception as e:  # a kernel-time failure leaves the event ratio as the row's only one
                res.setdefault("kernel_errors", []).append(f"{label} {d}: {one_line(e)}")
        res["vs_best_kernels"][label] = ratios


def compare(res: dict, labels: list, learns: bool, tol: float):
    """Best peers and ratios (best peer's time / ours: > 1 = ours faster; 0 where ours failed), B/A, the check."""
    ran = {n: r for n, r in res["peers"].items() if "fwd_ms" in r}
    fb = {n: r for n, r in ran.items() if "fb_ms" in r}
    best = {"fwd": min(ran, key=lambda n: ran[n]["fwd_ms"], default=None),
            "fb": min(fb, key=lambda n: fb[n]["fb_ms"], default=None),
            "fb_dbias": min((n for n in fb if fb[n]["dbias"]), key=lambda n: fb[n]["fb_ms"], default=None)
            if learns else None}
    res["best_peer"] = {"fwd": best["fwd"], "fb": best["fb"]}  # any peer (one without dBias runs without it)
    res["best_peer_dbias"] = best["fb_dbias"]  # f+b, peers that return dBias, where the row's bias learns
    res["vs_best"], res["host_paced"] = {}, {}
    for label in labels:
        mine, ratios, paced = res["impls"][label], {}, []
        for d, key in (("fwd", "fwd_ms"), ("fb", "fb_ms"), ("fb_dbias", "fb_ms")):
            if best[d] is not None:
                ratios[d] = ran[best[d]][key] / mine[key] if mine.get(key) else 0.0
                if host_paced(mine, key) or host_paced(ran[best[d]], key):
                    paced.append(d)
        res["vs_best"][label] = ratios
        res["host_paced"][label] = paced
    if len(labels) > 1:
        a, b = (res["impls"][label] for label in labels[:2])
        res["b_over_a"] = {d: a[k] / b[k] for d, k in (("fwd", "fwd_ms"), ("fb", "fb_ms")) if a.get(k) and b.get(k)}
    diff = ran[best["fwd"]].get("max_abs_diff") if best["fwd"] is not None else None
    res["check"] = {"vs": best["fwd"], "max_abs_diff": diff, "tol": tol, "ok": diff is None or diff <= tol}


# ------------------------------------------------------------------------------------------------------------------
# Output

def _ms(rec: dict, key: str) -> str:
    if "error" in rec:
        return "err"
    if "skipped" in rec:
        return "-"
    return f"{rec[key]:.3f}" if rec.get(key) is not None else "."


def header(labels: list, peer_names: list) -> str:
    h = f"{'row':<26}{'ours fwd':>9}{'f+b':>8}"
    if len(labels) > 1:
        h += f"{'B fwd':>9}{'f+b':>8}{'B/A fwd':>8}{'f+b':>6}"
    h += "".join(f"{name + ' fwd/f+b':>20}" for name in peer_names)
    return h + "   ours / best peer (time ratio, >1 = ours faster)"


def format_row(res: dict, labels: list, peer_names: list) -> str:
    a = res["impls"][labels[0]]
    line = f"{res['name']:<26}{_ms(a, 'fwd_ms'):>9}{_ms(a, 'fb_ms'):>8}"
    if len(labels) > 1:
        b, ba = res["impls"][labels[1]], res.get("b_over_a", {})
        line += f"{_ms(b, 'fwd_ms'):>9}{_ms(b, 'fb_ms'):>8}"
        line += "".join(f"{ba[d]:>{w}.2f}" if d in ba else f"{'.':>{w}}" for d, w in (("fwd", 8), ("fb", 6)))
    for name in peer_names:
        rec = res["peers"].get(name, {"skipped": ""})
        line += f"{_ms(rec, 'fwd_ms') + '/' + _ms(rec, 'fb_ms'):>20}"
    vs, best = res["vs_best"][labels[0]], {**res["best_peer"], "fb_dbias": res["best_peer_dbias"]}
    paced = res.get("host_paced", {}).get(labels[0], [])
    for d, tag in (("fwd", "fwd"), ("fb", "f+b"), ("fb_dbias", "dB")):
        if d in vs:
            line += f"  {tag} {vs[d]:.2f}x {best[d]}"
            if d in paced:
                kern = res.get("vs_best_kernels", {}).get(labels[0], {}).get(d)
                line += " (host)" if kern is None else f" (host; kernels {kern:.2f}x)"
    chk = res["check"]
    if chk["max_abs_diff"] is not None:
        line += f"  diff {chk['max_abs_diff']:.3g}{'' if chk['ok'] else ' !'}"
    reasons = [f"    {name}: {rec['error'] if 'error' in rec else rec['skipped']}"
               for name, rec in list(res["impls"].items()) + list(res["peers"].items())
               if "error" in rec or rec.get("skipped", "").startswith("budget")]
    return "\n".join([line] + reasons)


def summary_line(results: list, label: str, prefix: str = "") -> str:
    """`rows below 1.0x best peer: N of M (fwd), N of M (fwd+bwd); host-paced among them: H (fwd), H (fwd+bwd)`;
    M = rows where a peer ran in that direction, H = rows below whose ratio read a host's pace (host_paced). With
    kernel ratios (--kernel-time) it adds `; of those, below 1.0x in kernel time: K of T (fwd), K of T (fwd+bwd)`."""
    counts, kernels = [], []
    for d in ("fwd", "fb"):
        below = [r for r in results if d in r["vs_best"].get(label, {}) and r["vs_best"][label][d] < 1.0]
        ran = sum(d in r["vs_best"].get(label, {}) for r in results)
        paced = [r for r in below if d in r.get("host_paced", {}).get(label, [])]
        counts.append((len(below), ran, len(paced)))
        timed = [r["vs_best_kernels"][label][d] for r in paced if d in r.get("vs_best_kernels", {}).get(label, {})]
        kernels.append((sum(k < 1.0 for k in timed), len(timed)))
    (nf, mf, hf), (nb, mb, hb) = counts
    line = (f"{prefix}rows below 1.0x best peer: {nf} of {mf} (fwd), {nb} of {mb} (fwd+bwd); "
            f"host-paced among them: {hf} (fwd), {hb} (fwd+bwd)")
    if kernels[0][1] or kernels[1][1]:  # (--kernel-time)
        (kf, tf), (kb, tb) = kernels
        line += f"; of those, below 1.0x in kernel time: {kf} of {tf} (fwd), {kb} of {tb} (fwd+bwd)"
    return line


def summaries(results: list, labels: list) -> list:
    lines = [summary_line(results, labels[0])]
    if len(labels) > 1:
        lines.append(summary_line(results, labels[1], "variant B: "))
    return lines


# ------------------------------------------------------------------------------------------------------------------

def same_build(a: str, b: str) -> bool:
    """Whether two variant folders hold one build: the same path, or the same op namespace id and the same library
    bytes. Two different builds with one id (built from one git tree with different uncommitted changes: the
    device's checkouts all share a tree) cannot be loaded side by side, since the second import would resolve to
    the first's ops: that is an error naming the fix, not a B/A of 1.00."""
    if Path(a).resolve() == Path(b).resolve():
        return True
    meta = [Path(v) / "metadata.json" for v in (a, b)]
    ids = [json.loads(p.read_text()).get("id") if p.exists() else str(p) for p in meta]
    if ids[0] != ids[1]:
        return False
    libs = [sorted(Path(v).rglob("*.so")) for v in (a, b)]
    digests = [[hashlib.sha256(p.read_bytes()).hexdigest() for p in ps] for ps in libs]
    if digests[0] != digests[1]:
        raise SystemExit(f"--variant and --variant-b are different builds with the same op namespace id ({ids[0]}): "
                         "they cannot be loaded in one process. Build one with `python3 -m winattn build "
                         "--unique-id NAME`.")
    return True


def load_variants(a: str, b: Optional[str], forced_b: bool = False) -> dict:
    """{"ours": A} or {"ours": A, "ours_b": B}; the same build twice is loaded once (same_build): B/A then shows the
    run-to-run noise (or, with forced_b, what --b-force changes)."""
    kerns = {"ours": bc.load_kernel(a)}
    if b is None and forced_b:
        kerns["ours_b"] = kerns["ours"]
    if b is not None:
        same = same_build(a, b)
        kerns["ours_b"] = kerns["ours"] if same else bc.load_kernel(b)
        if same and not forced_b:
            print("--variant-b is the same build as --variant: B/A is the noise floor", file=sys.stderr)
    return kerns


def select(rows: list, only) -> list:
    if not only:
        return list(rows)
    return [r for r in rows if any(s in r.name or s == r.cls for s in only)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="build/torch-stable-abi210-cu130-x86_64-linux", help="the baseline build")
    ap.add_argument("--variant-b", default=None, help="a second build, timed in the same run (B/A column)")
    ap.add_argument("--b-force", default=None, metavar="NAMES", help="B runs with WINATTN_FORCE_KERNEL=NAMES (B is "
                    "--variant's build unless --variant-b names one)")
    ap.add_argument("--out", default="results/bench_shapes.json")
    ap.add_argument("--only", nargs="*", default=None, metavar="SUBSTR", help="rows whose name contains one (or "
                    "whose class is one) of these")
    ap.add_argument("--peers", default=",".join(p.name for p in PEERS), help="comma list of " +
                    ",".join(p.name for p in PEERS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=300.0, help="wall time Flex's compiles may take (see FlexBudget)")
    ap.add_argument("--list", action="store_true", help="print the rows and exit (no GPU)")
    ap.add_argument("--no-bwd", action="store_true", help="forward only")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: dry run with the CPU build")
    ap.add_argument("--kernel-time", action="store_true", help="host-paced ratios also in kernel time (CUPTI), ours "
                    "and that direction's best peer")
    args = ap.parse_args(argv)
    rows = select(ROWS, args.only)
    if args.list:
        print(list_table(rows))
        return 0
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = set(names) - {p.name for p in PEERS}
    if unknown:
        ap.error(f"unknown peers {sorted(unknown)}; known: {[p.name for p in PEERS]}")
    peers = [p for p in PEERS if p.name in names]
    cuda = args.device == "cuda"
    fa4 = "not asked for"
    if "fa4" in names and cuda:
        fa4 = fa4_import()[1] or "ready"
    if not cuda:
        rows = [shrink(r) for r in rows]
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", file=sys.stderr, flush=True)

    kerns = load_variants(args.variant, args.variant_b, forced_b=args.b_force is not None)
    labels = list(kerns)
    if cuda:
        bc.warm_up_gpu()
    opt = Options(reps=args.reps, device=args.device, bwd=not args.no_bwd, log=log,
                  budget=FlexBudget(args.budget_s) if cuda else None, fwd_only=() if cuda else ("flex",),
                  env={"ours_b": {"WINATTN_FORCE_KERNEL": args.b_force}} if args.b_force else {},
                  kernel_time=args.kernel_time)
    meta = {"gpu": torch.cuda.get_device_name() if cuda else "cpu (dry run)", "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version() if cuda else None, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "variant": args.variant, "variant_b": args.variant_b, "b_force": args.b_force, "modules": {k: m.__name__ for k, m in kerns.items()},
            "reps": args.reps, "budget_s": args.budget_s, "peers": names, "fa4": fa4, "bwd": not args.no_bwd,
            "kernel_time": args.kernel_time,
            "timing": "fwd alone; f+b = one region: forward + autograd.grad (no retain_graph)"}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    peer_names = [p.name for p in peers]
    log(f"FA4: {fa4}")
    print(header(labels, peer_names), flush=True)
    results = []
    for i, row in enumerate(rows):
        log(f"{i + 1}/{len(rows)} {row.name}")
        results.append(run_row(row, kerns, peers, opt, later=rows[i + 1:]))
        print(format_row(results[-1], labels, peer_names), flush=True)
        out_path.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    lines = summaries(results, labels)
    meta["wall_s"] = time.perf_counter() - t_start
    out_path.write_text(json.dumps({"meta": meta, "rows": results, "summary": lines}, indent=1))
    log(f"done; {out_path}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
