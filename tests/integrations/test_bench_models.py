"""benchmarks/bench_models.py's training workloads, run end to end on tiny configs with the CPU build.

The H200 runs them at full size; here the same functions (model build, loss/grad check, training step, timing)
run on the CPU with `device="cpu"`, the kernel published to the embedded Hub (`hub_repo`), so that a wrong step or
check is caught before a GPU run. What only the GPU shows (speed, memory) is not checked here.
"""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
import torch

from .conftest import REPO_ROOT

# The Flux transformer of tests/integrations/_models.py: one double and one single block, 2 heads of 16.
TINY_FLUX = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
# Swin-B 384's window (12, N = 144) on 24 x 24 tokens: stage 1 has 4 windows and a shifted block, stage 2 one window.
TINY_SWIN_B = dict(embed_dim=32, depths=(2, 2), num_heads=(2, 4), num_classes=10)


@pytest.fixture(scope="module")
def bm():
    spec = importlib.util.spec_from_file_location("bench_models", REPO_ROOT / "benchmarks" / "bench_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    assert bm.WORKLOADS == ("flux_step", "flux_train", "swin_t_train", "swin_b384_train")
