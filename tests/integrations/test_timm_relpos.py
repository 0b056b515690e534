"""timm BEiT and the vit_relpos family through `kernelize_relpos` (kernels' `kernelize` with the kernel's
`layers.BeitAttention` / `layers.RelPosAttention`, verified load): outputs and every gradient (relative-position
tables, shared biases and RelPosMlp weights included) match timm's own forward; modules the layers cannot run stay
on timm's forward with the reason in a warning.

Models are timm's registered configs (`timm.create_model`) at a tiny width: 64 px in 16 px patches (a 4 x 4 grid,
N = 16, or 17 with the class token), 2 blocks, 4 heads of 16, random weights.
"""

from __future__ import annotations

import copy
import sys
import warnings

import pytest
import torch

from winattn.integrations import install_torchvision_shim

install_torchvision_shim()

import timm  # noqa: E402
from timm.models.beit import Attention as BeitAttention  # noqa: E402
from timm.models.vision_transformer_relpos import RelPosAttention  # noqa: E402

from winattn.integrations.timm import (  # noqa: E402
    BEIT_LAYER_NAME,
    RELPOS_LAYER_NAME,
    Mode,
    VerifiedLayerRepository,
    kernelize_relpos,
    relpos_support,
)

TINY = dict(pretrained=False, img_size=64, embed_dim=64, depth=2, num_heads=4, num_classes=10)


def tiny(name: str, seed: int = 0, **kwargs):
    """timm's `name` at the tiny size, with every relative-position table, q/v bias and layer scale randomised:
    BEiT initialises its tables and q/v biases to zero, which would leave the bias out of the comparison."""
    torch.manual_seed(seed)
    model = timm.create_model(name, **{**TINY, **kwargs})
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(("relative_position_bias_table", "q_bias", "v_bias")):
                p.normal_(0, 0.5)
            elif pname.endswith(("gamma_1", "gamma_2")):
                p.fill_(1.0)
    return model


def _swapped(model):
    return [n for n, m in model.named_modules()
            if isinstance(m, (BeitAttention, RelPosAttention)) and "forward" in m.__dict__]


def _check_against_timm(model, expected_calls, calls, grad_names=()):
    """Forward in eval mode, then a training step's gradients (same seed before each forward: RelPosMlp's MLP has
    dropout), kernelized vs timm."""
    x = torch.randn(2, 3, 64, 64)
    target = torch.tensor([3, 7])
    model.eval()
    ours = kernelize_relpos(copy.deepcopy(model), mode=Mode.TRAINING)
    assert len(_swapped(ours)) == 2
    with torch.no_grad():
        torch.testing.assert_close(ours(x), model(x), atol=1e-5, rtol=1e-5)
    assert calls == expected_calls, calls
    grads = []
    for m in (model.train(), ours.train()):
        m.zero_grad()
        torch.manual_seed(5)
        torch.nn.functional.cross_entropy(m(x), target).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grad_names:
        assert n in grads[0] and grads[0][n].abs().sum() > 0, f"{n} gets a gradient"
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-5, rtol=1e-4, msg=n)


BEIT_CASES = {
    # beit_base_patch16_224's own config: a table per block ((2W-1)^2 + 3 = 52 rows, index 17 x 17), gathered into
    # a [1, nH, N, N] bias with dBias (the kernel's v3 backward; the table-term route's backward is v1 at head dim 64)
    "per_block_table": (dict(), [("attention", (1, 4, 17, 17))] * 2,
                        ["blocks.0.attn.relative_position_bias_table", "blocks.1.attn.relative_position_bias_table"]),
    # one model-level RelativePositionBias ([nH, N, N], given to every block): the kernel's `bias=` with dBias
    "shared": (dict(use_rel_pos_bias=False, use_shared_rel_pos_bias=True), [("attention", (4, 17, 17))] * 2,
               ["rel_pos_bias.relative_position_bias_table"]),
    # both: the gathered table plus the shared bias, one [1, nH, N, N] bias
    "table_and_shared": (dict(use_shared_rel_pos_bias=True), [("attention", (1, 4, 17, 17))] * 2,
                         ["rel_pos_bias.relative_position_bias_table", "blocks.1.attn.relative_position_bias_table"]),
    # absolute position embedding only (use_rel_pos_bias=False): no bias at all
    "no_bias": (dict(use_rel_pos_bias=False, use_abs_pos_emb=True), [("attention", None)] * 2, ["pos_embed"]),
}


@pytest.mark.parametrize("case", list(BEIT_CASES))
def test_beit_matches_timm(hub_repo, relpos_kernel_calls, case):
    kwargs, expected, grad_names = BEIT_CASES[case]
    model = tiny("beit_base_patch16_224", **kwargs)
    _check_against_timm(model, expected, relpos_kernel_calls,
                        ["blocks.0.attn.q_bias", "blocks.0.attn.qkv.weight", *grad_names])


def test_beit_qkv_bias_separate(hub_repo, relpos_kernel_calls):
    model = tiny("beit_base_patch16_224", seed=2)
    for m in model.modules():
        if isinstance(m, BeitAttention):
            m.qkv_bias_separate = True
    _check_against_timm(model, [("attention", (1, 4, 17, 17))] * 2, relpos_kernel_calls, ["blocks.1.attn.v_bias"])


RELPOS_CASES = {
    # vit_relpos_* default: RelPosMlp ('cr' log coords), the module's computed bias [1, nH, N, N]
    "mlp": ("vit_relpos_base_patch16_224", dict(), [("attention", (1, 4, 16, 16))] * 2,
            ["blocks.0.attn.rel_pos.mlp.fc1.weight"]),
    # class token: the MLP bias padded with zeros for it (N = 17); qk_norm on
    "mlp_cls_qk_norm": ("vit_relpos_base_patch16_cls_224", dict(qk_norm=True), [("attention", (1, 4, 17, 17))] * 2,
                        ["blocks.0.attn.rel_pos.mlp.fc2.weight", "blocks.0.attn.q_norm.weight"]),
    # swin-v2 style MLP (sigmoid, gain 16)
    "mlp_swin": ("vit_relpos_medium_patch16_rpn_224", dict(rel_pos_type="mlp_swin"),
                 [("attention", (1, 4, 16, 16))] * 2, ["blocks.0.attn.rel_pos.mlp.fc1.weight"]),
    # RelPosBias: the table ((2W-1)^2 = 49 rows) gathered in the kernel through its flat [N * N] index
    "bias_table": ("vit_relpos_base_patch16_224", dict(rel_pos_type="bias"), [("attention", (1, 4, 16, 16))] * 2,
                   ["blocks.0.attn.rel_pos.relative_position_bias_table"]),
    # RelPosBias with a class token: 49 + 3 rows, flat index of 17 * 17
    "bias_table_cls": ("vit_relpos_base_patch16_224", dict(rel_pos_type="bias", class_token=True),
                       [("attention", (1, 4, 17, 17))] * 2, ["blocks.1.attn.rel_pos.relative_position_bias_table"]),
    # vit_srelpos_*: one model-level RelPosMlp, its bias given to every block as shared_rel_pos
    "shared_mlp": ("vit_srelpos_small_patch16_224", dict(), [("attention", (1, 4, 16, 16))] * 2,
                   ["shared_rel_pos.mlp.fc1.weight"]),
}


@pytest.mark.parametrize("case", list(RELPOS_CASES))
def test_vit_relpos_matches_timm(hub_repo, relpos_kernel_calls, case):
    name, kwargs, expected, grad_names = RELPOS_CASES[case]
    _check_against_timm(tiny(name, seed=1, **kwargs), expected, relpos_kernel_calls,
                        ["blocks.0.attn.qkv.weight", *grad_names])


def test_the_layers_come_from_the_verified_load(hub_repo):
    module = VerifiedLayerRepository().load_module()
    assert module.__winattn_info__.repo_id == hub_repo.repo_id and module.__winattn_info__.source == "hub"
    layers = {}
    for name in (BEIT_LAYER_NAME, RELPOS_LAYER_NAME):
        layer = VerifiedLayerRepository(layer_name=name).load()
        assert layer.__name__ == name and layer.__module__ == f"{module.__name__}.layers"
        assert layer.can_torch_compile and layer.has_backward
        layers[name] = layer
    model = kernelize_relpos(tiny("beit_base_patch16_224"))
    assert all(model.get_submodule(n).forward.__func__ is layers[BEIT_LAYER_NAME].forward for n in _swapped(model))
    model = kernelize_relpos(tiny("vit_relpos_base_patch16_224"))
    assert all(model.get_submodule(n).forward.__func__ is layers[RELPOS_LAYER_NAME].forward for n in _swapped(model))


class _BeitAttentionVariant(BeitAttention):
    """A subclass with its own forward: the layer cannot know what it computes."""

    def forward(self, x, shared_rel_pos_bias=None):
        return super().forward(x, shared_rel_pos_bias) * 0.5


def test_unsupported_modules_keep_timms_forward_with_the_reason(hub_repo, relpos_kernel_calls):
    from functools import partial

    from timm.layers import RelPosBiasTf

    # vit_relpos with a TF-style (MaxViT) relative-position bias in block 0, which the layer does not run
    model = tiny("vit_relpos_base_patch16_224", rel_pos_type="bias").eval()
    block0 = model.blocks[0].attn
    block0.rel_pos = partial(RelPosBiasTf, window_size=(4, 4))(num_heads=4)
    # BEiT with a subclass in block 1 and attention dropout everywhere
    beit = tiny("beit_base_patch16_224", attn_drop_rate=0.1).eval()
    old = beit.blocks[1].attn
    new = _BeitAttentionVariant(64, num_heads=4, qkv_bias=True, window_size=(4, 4))
    new.load_state_dict(old.state_dict())
    beit.blocks[1].attn = new

    support = relpos_support(model)
    assert support["blocks.1.attn"] is None and "RelPosBiasTf" in support["blocks.0.attn"]
    assert "subclasses timm's Attention" in relpos_support(beit)["blocks.1.attn"]
    assert relpos_support(beit)["blocks.0.attn"] is None  # dropout is no problem for inference
    assert "attention dropout 0.1" in relpos_support(beit, mode=Mode.TRAINING)["blocks.0.attn"]

    x = torch.randn(2, 3, 64, 64)
    for m, mode, kept in ((model, Mode.INFERENCE, ["blocks.0.attn"]), (beit, Mode.INFERENCE, ["blocks.1.attn"]),
                          (beit, Mode.TRAINING, ["blocks.0.attn", "blocks.1.attn"])):
        with torch.no_grad():
            expected = m(x)
        with pytest.warns(UserWarning, match=f"{len(kept)} of 2 attention modules keep timm's forward: "
                                             + ".*".join(kept)):
            ours = kernelize_relpos(copy.deepcopy(m), mode=mode)
        assert sorted(set(_swapped(ours))) == sorted({"blocks.0.attn", "blocks.1.attn"} - set(kept))
        with torch.no_grad():
            torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="strict=True.*" + kept[0]):
            kernelize_relpos(copy.deepcopy(m), mode=mode, strict=True)
    assert len(relpos_kernel_calls) == 2, "one kernelized module each in the first two models"


def test_unsupported_head_dim_keeps_timms_forward(hub_repo):
    model = tiny("beit_base_patch16_224", embed_dim=48).eval()  # 4 heads of 12
    assert all("head dim 12" in why for why in relpos_support(model).values())
    with pytest.warns(UserWarning, match="2 of 2"):
        kernelize_relpos(model)
    assert not _swapped(model)


def test_training_after_inference_kernelize_refuses_attention_dropout(hub_repo):
    model = kernelize_relpos(tiny("vit_relpos_base_patch16_224", attn_drop_rate=0.1), mode=Mode.INFERENCE)
    with torch.no_grad():
        model.eval()(torch.randn(1, 3, 64, 64))
    with pytest.raises(ValueError, match="RelPosAttention does not implement attention dropout"):
        model.train()(torch.randn(1, 3, 64, 64))


def test_a_model_without_relpos_attention_is_left_alone(hub_repo, load_calls):
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, num_classes=2)
    with pytest.warns(UserWarning, match="no timm BEiT Attention or vit_relpos RelPosAttention"):
        assert kernelize_relpos(model) is model
    assert not load_calls, "nothing is loaded for a model without such modules"


def test_untrusted_publisher_needs_trust_remote_code(hub_repo):
    from winattn.errors import UntrustedKernelError

    with pytest.raises(UntrustedKernelError):
        kernelize_relpos(tiny("beit_base_patch16_224"), repo_id=hub_repo.untrusted_repo_id)
    model = kernelize_relpos(tiny("beit_base_patch16_224"), repo_id=hub_repo.untrusted_repo_id,
                             trust_remote_code=True)
    assert len(_swapped(model)) == 2


def test_a_kernel_without_the_layer_is_refused_before_anything_changes(hub_repo, monkeypatch):
    """A kernel published before these layers existed: ValueError naming the layer, no module replaced."""
    layers = sys.modules[VerifiedLayerRepository().load().__module__]
    monkeypatch.delattr(layers, RELPOS_LAYER_NAME)
    model = tiny("vit_relpos_base_patch16_224")
    with pytest.raises(ValueError, match="layer `RelPosAttention` not found in kernel"):
        kernelize_relpos(model)
    assert not _swapped(model)


def test_reference_fallback_when_no_variant_fits(hub_repo):
    """`fallback="reference"` serves the layers too (pure PyTorch)."""
    model = tiny("vit_relpos_base_patch16_224", rel_pos_type="bias", class_token=True).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
        ours = kernelize_relpos(copy.deepcopy(model), repo_id=hub_repo.gpu_only_repo_id, fallback="reference")
        torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=1e-5)
    assert len(_swapped(ours)) == 2


@pytest.mark.slow
def test_torch_compile_fullgraph_forward_and_backward(hub_repo):
    """BEiT (table + shared bias) and vit_relpos (flat-index table) compile without graph breaks, the index range
    check inside the graph."""
    torch._dynamo.reset()
    x = torch.randn(1, 3, 64, 64)
    for model in (tiny("beit_base_patch16_224", use_shared_rel_pos_bias=True),
                  tiny("vit_relpos_base_patch16_224", rel_pos_type="bias")):
        model.eval()
        ours = kernelize_relpos(copy.deepcopy(model), mode=Mode.TRAINING | Mode.TORCH_COMPILE)
        compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = compiled(x)
        expected = model(x)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        got.sum().backward()
        expected.sum().backward()
        table = [n for n, _ in model.named_parameters() if n.endswith("relative_position_bias_table")][0]
        torch.testing.assert_close(ours.get_submodule(table.rsplit(".", 1)[0]).relative_position_bias_table.grad,
                                   model.get_submodule(table.rsplit(".", 1)[0]).relative_position_bias_table.grad,
                                   atol=1e-5, rtol=1e-4)
