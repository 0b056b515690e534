"""Tiny random-weight diffusers transformers (ecosystem.md §1.3) with head dims the kernel supports.

Each entry builds the model and its inputs on CPU in float32 from a seed. Masks reach the dispatcher as listed in
ecosystem.md §1.4: QwenImage and HunyuanVideo bool [B, 1, 1, S], LTX-Video float additive [B, H, 1, T] (cross
attention), Flux and Wan none (Flux takes a caller mask through joint_attention_kwargs).
"""

from __future__ import annotations

import torch


def _padding_mask(batch: int, length: int, valid: list, dtype=torch.long) -> torch.Tensor:
    m = torch.zeros(batch, length, dtype=dtype)
    for b, n in enumerate(valid):
        m[b, :n] = 1
    return m


def flux(seed: int = 0, batch: int = 1):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
    inputs = dict(hidden_states=torch.randn(batch, 16, 4), encoder_hidden_states=torch.randn(batch, 8, 32),
                  pooled_projections=torch.randn(batch, 32), timestep=torch.ones(batch), img_ids=torch.zeros(16, 3),
                  txt_ids=torch.zeros(8, 3))
    return model, inputs


def flux_masked(seed: int = 0):
    model, inputs = flux(seed, batch=2)
    mask = torch.ones(2, 1, 1, 24, dtype=torch.bool)
    mask[1, ..., 5:8] = False  # padding text tokens of sample 1
    inputs["joint_attention_kwargs"] = {"attention_mask": mask}
    return model, inputs


def qwenimage(seed: int = 0):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(seed)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=1,
                                        attention_head_dim=16, num_attention_heads=3, joint_attention_dim=16,
                                        axes_dims_rope=(8, 4, 4))
    inputs = dict(hidden_states=torch.randn(2, 16, 16), encoder_hidden_states=torch.randn(2, 7, 16),
                  encoder_hidden_states_mask=_padding_mask(2, 7, [7, 4]), timestep=torch.ones(2),
                  img_shapes=[(1, 4, 4)] * 2)
    return model, inputs


def ltx_video(seed: int = 0):
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    model = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1,
                                       num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
                                       num_layers=1, caption_channels=16)
    inputs = dict(hidden_states=torch.randn(2, 32, 8), encoder_hidden_states=torch.randn(2, 12, 16),
                  timestep=torch.ones(2), encoder_attention_mask=_padding_mask(2, 12, [12, 9]), num_frames=2,
                  height=4, width=4)
    return model, inputs


def wan(seed: int = 0, head_dim: int = 16):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=head_dim,
                                  in_channels=4, out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=1,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    inputs = dict(hidden_states=torch.randn(1, 4, 2, 8, 8), timestep=torch.ones(1),
                  encoder_hidden_states=torch.randn(1, 12, 16))
    return model, inputs


def hunyuan_video(seed: int = 0):
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(seed)
    model = HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                           num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=1,
                                           patch_size_t=1, guidance_embeds=True, text_embed_dim=16,
                                           pooled_projection_dim=8, rope_axes_dim=(4, 6, 6))
    inputs = dict(hidden_states=torch.randn(2, 4, 1, 8, 8), timestep=torch.ones(2),
                  encoder_hidden_states=torch.randn(2, 12, 16),
                  encoder_attention_mask=_padding_mask(2, 12, [12, 7]), pooled_projections=torch.randn(2, 8),
                  guidance=torch.full((2,), 1000.0))
    return model, inputs


MODELS = {
    "flux": flux,
    "flux_masked": flux_masked,
    "qwenimage": qwenimage,
    "ltx_video": ltx_video,
    "wan": wan,
    "hunyuan_video": hunyuan_video,
}


def output(result) -> torch.Tensor:
    return result.sample if hasattr(result, "sample") else result[0]
