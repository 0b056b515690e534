"""benchmarks/bench_models.py's training workloads, run end to end on tiny configs with the CPU build.

The H200 runs them at full size; here the same functions (model build, loss/grad check, training step, timing)
run on the CPU with `device="cpu"`, the kernel published to the embedded Hub (`hub_repo`), so that a wrong step or
check is caught before a GPU run. What only the GPU shows (speed, memory) is not checked here.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from repo_modules import load_repo_module

# The Flux transformer of tests/integrations/_models.py: one double and one single block, 2 heads of 16.
TINY_FLUX = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
# Swin-B 384's window (12, N = 144) on 24 x 24 tokens: stage 1 has 4 windows and a shifted block, stage 2 one window.
TINY_SWIN_B = dict(embed_dim=32, depths=(2, 2), num_heads=(2, 4), num_classes=10)
# BEiT-B/16's config (table per block, q/v biases, layer scale) at 64 px: 4 x 4 patches + class token (N = 17, a
# 52-row table), 2 blocks of 4 heads of 16.
TINY_BEIT = dict(embed_dim=64, depth=2, num_heads=4, num_classes=10)
# SDXL's UNet structure (text_time conditioning, linear projections, a DownBlock2D then cross-attention blocks with
# 1 and 2 transformer layers, the cross-attention mid block) at 32 / 64 channels, heads of 16: 16 attention modules.
TINY_SDXL = dict(block_out_channels=[32, 64], down_block_types=["DownBlock2D", "CrossAttnDownBlock2D"],
                 up_block_types=["CrossAttnUpBlock2D", "UpBlock2D"], attention_head_dim=[2, 4],
                 transformer_layers_per_block=[1, 2], layers_per_block=1, cross_attention_dim=32,
                 addition_time_embed_dim=8, projection_class_embeddings_input_dim=16 + 6 * 8, norm_num_groups=8,
                 sample_size=8)
# Wan 2.1's transformer (RoPE over frames / rows / columns, rms-norm q / k across heads, cross-attention to the
# text) at 2 blocks of 2 heads of 16: a 3 x 4 x 4 latent in (1, 2, 2) patches is 12 tokens, 5 text tokens.
TINY_WAN = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, text_dim=32, freq_dim=32,
                ffn_dim=64, num_layers=2, rope_max_seq_len=32)


@pytest.fixture(scope="module")
def bm():
    return load_repo_module("benchmarks/bench_models.py")


@pytest.fixture
def flux_kernel_calls(wd):
    """Counts the kernel's `attention` calls made through the window_attn_hub backend."""
    backend = wd._BACKENDS[wd.DEFAULT_NAME]
    module = wd.load_backend()
    calls = []

    class Counting:
        def attention(self, *args, **kwargs):
            calls.append(args[0].requires_grad)
            return module.attention(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(module, name)

    backend.module = Counting()
    return calls


def _check_result(res, ours, grad_rtol):
    for name in ("native", ours):
        assert res[name]["step_ms"] > 0
    check = res["check_vs_native"]
    assert math.isfinite(check["loss_ref"]) and check["loss_ref"] > 0
    assert check["loss_abs_diff"] <= 2e-3 * check["loss_ref"], check
    assert check["grad_ref_max_abs"] > 0, "the checked parameter gets a gradient"
    assert check["grad_max_abs_diff"] <= grad_rtol * check["grad_ref_max_abs"], check
    assert res["speedup"] > 0


@pytest.mark.parametrize("layers, param", [((1, 1), "transformer_blocks.0.attn.to_q.weight"),
                                           ((0, 1), "single_transformer_blocks.0.attn.to_q.weight")])
def test_flux_train_step_runs_both_backends_and_matches_native(bm, wd, flux_kernel_calls, layers, param):
    res = bm.bench_flux_train(2, layers, device="cpu", tokens=(16, 8), **TINY_FLUX)
    assert res["layers"] == list(layers) and res["tokens"] == 24 and res["full_model"] is False
    assert res["check_vs_native"]["grad_param"] == param
    _check_result(res, "window_attn_hub", grad_rtol=2e-2)
    # One attention call per block and forward: the check's, then 1 warm-up + 2 timed steps.
    assert len(flux_kernel_calls) == sum(layers) * 4 and all(flux_kernel_calls), "all on the autograd path"


def test_flux_train_layers_keep_the_width(bm, wd):
    model = bm.build_flux("meta", layers=(2, 3))
    assert (model.config.num_layers, model.config.num_single_layers) == (2, 3)
    assert (model.config.num_attention_heads, model.config.attention_head_dim) == (24, 128)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_swin_b384_train_step_runs_both_attentions_and_matches_timm(bm, swin_kernel_calls):
    model_name, _, _ = bm.SWIN["swin_b384_train"]
    res = bm.bench_swin(2, model_name, 2, 96, device="cpu", **TINY_SWIN_B)
    assert res["model"] == "swin_base_patch4_window12_384"
    assert res["check_vs_native"]["grad_param"] == "layers.0.blocks.1.attn.relative_position_bias_table"
    _check_result(res, "kernelize_swin", grad_rtol=2e-2)
    # 4 blocks per forward, stage 1's shifted one with a mask: the check, 1 warm-up + 2 timed steps.
    assert len(swin_kernel_calls) == 4 * 4 and sum(swin_kernel_calls) == 4


def test_beit_train_step_runs_both_attentions_and_matches_timm(bm, relpos_kernel_calls):
    model_name, _, _ = bm.BEIT["beit_b16_train"]
    res = bm.bench_beit(2, model_name, 2, 64, device="cpu", **TINY_BEIT)
    assert res["model"] == "beit_base_patch16_224"
    assert res["check_vs_native"]["grad_param"] == "blocks.0.attn.relative_position_bias_table"
    _check_result(res, "kernelize_relpos", grad_rtol=2e-2)
    # 2 blocks per forward, each its 52-row table gathered into one [1, 4, 17, 17] bias for `attention(bias=)` (the
    # backward that reduces dBias fastest, see layers.BeitAttention): the check, 1 warm-up + 2 timed steps.
    assert relpos_kernel_calls == [("attention", (1, 4, 17, 17))] * 2 * 4


def test_beit_tables_are_randomised_for_the_check(bm):
    import timm

    model = timm.create_model("beit_base_patch16_224", pretrained=False, img_size=64, **TINY_BEIT)
    tables = [p for n, p in model.named_parameters() if n.endswith("relative_position_bias_table")]
    assert len(tables) == 2 and all((t == 0).all() for t in tables), "timm starts them at zero"
    bm.randomize_rel_pos_tables(model)
    assert all(0.3 < t.std() < 0.7 for t in tables)


def test_sdxl_config_is_sdxl_base(bm):
    """The full config builds (on the meta device) into SDXL base's UNet: 2.57 B parameters, heads of 64, 70
    transformer blocks, a 2048-wide cross-attention and the 2816-wide text_time projection."""
    model = bm.build_sdxl_unet("meta")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 2.57
    from diffusers.models.attention_processor import Attention

    attns = [m for m in model.modules() if isinstance(m, Attention)]
    assert len(attns) == 140 and {a.inner_dim // a.heads for a in attns} == {64}
    assert {a.to_k.in_features for a in attns if a.is_cross_attention} == {2048}
    assert model.add_embedding.linear_1.in_features == 2816
    kw = bm.sdxl_inputs(model.config, "meta")
    assert tuple(kw["sample"].shape) == (2, 4, 128, 128)
    assert tuple(kw["encoder_hidden_states"].shape) == (2, 77, 2048)
    assert tuple(kw["added_cond_kwargs"]["text_embeds"].shape) == (2, 1280)
    assert tuple(kw["added_cond_kwargs"]["time_ids"].shape) == (2, 6)


def test_dispatch_processor_equals_attn_processor_2_0(bm, ad):
    """The bench's DispatchAttnProcessor on diffusers' native backend computes what AttnProcessor2_0 does, also with
    an attention mask, group norm and residual connection (AttnProcessor2_0's other inputs)."""
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=32, heads=2, dim_head=16, cross_attention_dim=24, norm_num_groups=4,
                     residual_connection=True, rescale_output_factor=2.0)
    x, ctx = torch.randn(2, 32, 4, 4), torch.randn(2, 7, 24)  # [B, C, H, W] input: the 4-D path
    mask = torch.ones(2, 7)
    mask[1, 5:] = 0
    processor = bm.DispatchAttnProcessor()
    processor._attention_backend = ad.AttentionBackendName.NATIVE
    expected = AttnProcessor2_0()(attn, x, ctx, attention_mask=mask)
    torch.testing.assert_close(processor(attn, x, ctx, attention_mask=mask), expected, atol=1e-6, rtol=1e-6)


def test_sdxl_step_runs_on_the_kernel_and_matches_native(bm, wd, flux_kernel_calls):
    res = bm.bench_sdxl(2, device="cpu", batch=2, size=64, text_len=7, rounds=2, **TINY_SDXL)
    assert res["native_processors"] == {"AttnProcessor2_0": 16}
    assert res["window_attn_hub_modules"] == 16 and res["native_dispatch_modules"] == 16
    for name in ("native", "window_attn_hub", "native_dispatch"):  # the three took turns, two rounds
        assert res[name]["step_ms"] > 0 and len(res[name]["rounds_ms"]) == 2
    assert res["ref_max_abs"] > 0
    assert res["max_abs_diff_vs_native"] <= 2e-2 * res["ref_max_abs"], res
    assert res["native_dispatch_max_abs_diff"] <= 2e-2 * res["ref_max_abs"], res
    assert res["speedup"] > 0
    # Every attention module on the kernel, forward only: the check, then per round 1 warm-up + 2 timed forwards.
    assert len(flux_kernel_calls) == 16 * (1 + 2 * 3) and not any(flux_kernel_calls)


def test_wan_config_is_wan21_t2v_1p3b(bm):
    """The full config builds (on the meta device) into Wan 2.1 T2V 1.3B's transformer: 1.42 B parameters, 30 blocks
    of 12 heads of 128, UMT5's 4096-wide text; bf16 except what diffusers keeps in fp32; 32760 tokens per call."""
    model = bm.build_wan("meta")
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 1.42
    assert len(model.blocks) == 30 and model.config.num_attention_heads == 12
    assert model.config.attention_head_dim == 128 and model.config.text_dim == 4096
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["blocks.0.attn1.to_q.weight"] == torch.bfloat16
    assert dtypes["blocks.0.scale_shift_table"] == torch.float32
    assert dtypes["condition_embedder.time_embedder.linear_1.weight"] == torch.float32
    kw = bm.wan_inputs(model.config, "meta")
    assert tuple(kw["hidden_states"].shape) == (1, 16, 21, 60, 104)
    assert tuple(kw["encoder_hidden_states"].shape) == (1, 512, 4096)
    assert 21 * (60 // 2) * (104 // 2) == 32760


def test_wan_step_runs_on_the_kernel_and_matches_native(bm, wd, flux_kernel_calls):
    res = bm.bench_wan(2, device="cpu", latent=(3, 4, 4), text_len=5, **TINY_WAN)
    assert res["tokens"] == 12 and res["text_len"] == 5
    for name in ("native", "window_attn_hub"):
        assert res[name]["step_ms"] > 0
    assert res["ref_max_abs"] > 0
    assert res["max_abs_diff_vs_native"] <= 2e-2 * res["ref_max_abs"], res
    assert res["speedup"] > 0
    # Self- and cross-attention of both blocks on the kernel, forward only: the check + 1 warm-up + 2 timed calls.
    assert len(flux_kernel_calls) == 2 * 2 * 4 and not any(flux_kernel_calls)


@pytest.mark.parametrize("argv", [["--only", "swin_b_train"], ["--flux-layers", "0", "0"],
                                  ["--flux-layers", "-1", "4"]])
def test_cli_refuses_unknown_workloads_and_empty_flux(bm, monkeypatch, capsys, argv):
    monkeypatch.setattr(sys, "argv", ["bench_models.py", *argv])

    def past_the_checks(*args, **kwargs):
        raise AssertionError("main() went past its argument checks")

    monkeypatch.setattr(bm.tempfile, "mkdtemp", past_the_checks)  # the first thing main() does after them
    with pytest.raises(SystemExit) as e:
        bm.main()
    assert e.value.code == 2
    assert ("invalid choice" if argv[0] == "--only" else "--flux-layers needs") in capsys.readouterr().err


def test_workload_names(bm):
    assert bm.WORKLOADS == ("flux_step", "flux_train", "swin_t_train", "swin_b384_train", "beit_b16_train",
                            "sdxl_step", "wan_step")
