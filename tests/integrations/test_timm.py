"""timm Swin through `kernels.kernelize` with the kernel's `layers.WindowAttention` (verified load): outputs and
gradients (the relative-position bias table's dBias included) match timm's own forward; SwinV2 is refused.
"""

from __future__ import annotations

import copy

import pytest
import torch

from winattn.integrations import install_torchvision_shim

install_torchvision_shim()

import timm  # noqa: E402
from timm.models.swin_transformer import SwinTransformer, WindowAttention  # noqa: E402

from winattn.integrations.timm import LAYER_NAME, Mode, VerifiedLayerRepository, kernelize_swin  # noqa: E402


def tiny_swin(seed=0, embed_dim=32, num_heads=(2, 4), **kwargs):
    """8x8 tokens, 4x4 windows: stage 1 has shifted windows (mask of 4 windows), stage 2 a single window."""
    torch.manual_seed(seed)
    model = SwinTransformer(img_size=32, patch_size=4, embed_dim=embed_dim, depths=(2, 2), num_heads=num_heads,
                            window_size=4, num_classes=10, **kwargs)
    with torch.no_grad():  # timm initialises the bias tables with std 0.02; make the bias matter in the check
        for m in model.modules():
            if isinstance(m, WindowAttention):
                m.relative_position_bias_table.normal_(0, 0.5)
    return model


def _swapped(model):
    return [m for m in model.modules() if isinstance(m, WindowAttention) and "forward" in m.__dict__]


def test_inference_matches_timm(hub_repo, swin_kernel_calls):
    model = tiny_swin().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    ours = kernelize_swin(copy.deepcopy(model), mode=Mode.INFERENCE)
    assert len(_swapped(ours)) == 4
    with torch.no_grad():
        got = ours(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(swin_kernel_calls) == 4 and any(swin_kernel_calls), "all four blocks ran the kernel, shifted ones masked"


def test_training_gradients_match_timm_including_the_bias_table(hub_repo, swin_kernel_calls):
    model = tiny_swin(seed=1).train()
    twin = kernelize_swin(copy.deepcopy(model), mode=Mode.TRAINING)
    x = torch.randn(2, 3, 32, 32)
    target = torch.tensor([3, 7])
    grads = []
    for m in (model, twin):
        m.zero_grad()
        torch.nn.functional.cross_entropy(m(x), target).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    assert len(swin_kernel_calls) == 4
    tables = [n for n in grads[0] if n.endswith("relative_position_bias_table")]
    assert len(tables) == 4 and all(grads[0][n].abs().sum() > 0 for n in tables)
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-5, rtol=1e-4, msg=n)


def test_the_layer_comes_from_the_verified_load(hub_repo):
    repo = VerifiedLayerRepository()
    module = repo.load_module()
    info = module.__winattn_info__
    assert info.repo_id == hub_repo.repo_id and info.source == "hub"
    layer = repo.load()
    assert layer.__name__ == LAYER_NAME and layer.__module__ == f"{module.__name__}.layers"
    assert layer.can_torch_compile and layer.has_backward
    model = kernelize_swin(tiny_swin(), mode=Mode.INFERENCE)
    assert all(m.forward.__func__ is layer.forward for m in _swapped(model))


def test_timm_create_model_swin_tiny(hub_repo):
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=64, num_classes=5).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
        got = kernelize_swin(copy.deepcopy(model), mode=Mode.INFERENCE)(x)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_torch_compile_fullgraph(hub_repo):
    torch._dynamo.reset()
    model = tiny_swin().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    ours = kernelize_swin(copy.deepcopy(model), mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_swinv2_is_refused_with_a_clear_message(hub_repo):
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    model = SwinTransformerV2(img_size=32, patch_size=4, embed_dim=32, depths=(2,), num_heads=(2,), window_size=4)
    with pytest.raises(ValueError, match="SwinV2.*logit_scale, cpb_mlp"):
        kernelize_swin(model)


def test_unsupported_head_dim_and_attention_dropout_are_refused(hub_repo):
    with pytest.raises(ValueError, match="head dim 12"):
        kernelize_swin(tiny_swin(embed_dim=24, num_heads=(2, 4)))
    with pytest.raises(ValueError, match="attention dropout"):
        kernelize_swin(tiny_swin(attn_drop_rate=0.1), mode=Mode.TRAINING)
    kernelize_swin(tiny_swin(attn_drop_rate=0.1), mode=Mode.INFERENCE)  # eval-only use is fine


def test_untrusted_publisher_needs_trust_remote_code(hub_repo):
    from winattn.errors import UntrustedKernelError

    with pytest.raises(UntrustedKernelError):
        kernelize_swin(tiny_swin(), repo_id=hub_repo.untrusted_repo_id)
    kernelize_swin(tiny_swin(), repo_id=hub_repo.untrusted_repo_id, trust_remote_code=True)


def test_reference_fallback_when_no_variant_fits(hub_repo):
    """`fallback="reference"` (an explicit opt-in of winattn.load) also serves the layer: pure PyTorch."""
    model = tiny_swin().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
        ours = kernelize_swin(copy.deepcopy(model), repo_id=hub_repo.gpu_only_repo_id, fallback="reference")
        torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=1e-5)
    repo = VerifiedLayerRepository(hub_repo.gpu_only_repo_id, fallback="reference")
    assert repo.load_module().__winattn_info__.source == "reference"
    assert repo.load().__module__.endswith(".layers")
