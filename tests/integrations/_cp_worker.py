"""Rank body of the context-parallel test (run by torch.multiprocessing.spawn, 2 CPU processes, gloo).

Each rank loads the kernel from the embedded Hub through the backend's selection step (the parent's environment points
huggingface_hub at it), then checks against full-sequence torch SDPA computed locally:

- ring attention (ring_degree=2) and Ulysses attention (ulysses_degree=2) at the dispatcher: this rank's output
  shard and the gradients of its q/k/v shards;
- Ulysses with a [B, S_local] key-padding mask (diffusers all-gathers it);
- a tiny Flux transformer with `enable_parallelism(ContextParallelConfig(ring_degree=2))` (ring) against `native`
  without parallelism.
"""

from __future__ import annotations

import os
import traceback


def _qkv(seed, B=1, S=8, H=2, D=16):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, S, H, D, generator=g) for _ in range(3)]


def _config(rank, world, ring, ulysses):
    import torch
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    cp = ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses)
    mesh = init_device_mesh("cpu", cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(rank, world, torch.device("cpu"), mesh=mesh)
    return config


def _check_dispatch(rank, world, ring, ulysses, masked):
    import torch
    from diffusers.models import attention_dispatch as ad

    config = _config(rank, world, ring, ulysses)
    q, k, v = _qkv(seed=7)
    S = q.shape[1]
    part = slice(rank * S // world, (rank + 1) * S // world)
    keep = torch.ones(q.shape[0], S, dtype=torch.bool)
    if masked:
        keep[:, S - 3:] = False
    # Full-sequence reference with autograd.
    full = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in full), attn_mask=keep[:, None, None, :] if masked else None).transpose(1, 2)
    grad_out = torch.randn(ref.shape, generator=torch.Generator().manual_seed(11))
    ref.backward(grad_out)
    # This rank's shard through the backend.
    local = [t[:, part].clone().requires_grad_(True) for t in (q, k, v)]
    out = ad.dispatch_attention_fn(*local, attn_mask=keep[:, part] if masked else None,
                                   backend=ad.AttentionBackendName("window_attn_hub"), parallel_config=config)
    torch.testing.assert_close(out, ref[:, part].detach(), atol=1e-5, rtol=1e-5)
    out.backward(grad_out[:, part])
    for name, mine, theirs in zip("qkv", local, full):
        torch.testing.assert_close(mine.grad, theirs.grad[:, part], atol=1e-5, rtol=1e-5, msg=f"d{name}")


def _check_model(rank, world):
    import torch
    from diffusers import FluxTransformer2DModel
    from diffusers.models._modeling_parallel import ContextParallelConfig

    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
    inputs = dict(hidden_states=torch.randn(1, 16, 4), encoder_hidden_states=torch.randn(1, 8, 32),
                  pooled_projections=torch.randn(1, 32), timestep=torch.ones(1), img_ids=torch.zeros(16, 3),
                  txt_ids=torch.randn(8, 3))
    with torch.no_grad():
        native = model(**inputs).sample
    model.set_attention_backend("window_attn_hub")
    # diffusers picks `torch.device(<accelerator type>, rank % torch.accelerator.device_count())`, which divides by
    # zero on a machine without accelerators; one "device" per CPU process is what the test needs.
    torch.accelerator.device_count = lambda: 1
    model.enable_parallelism(config=ContextParallelConfig(ring_degree=world))
    with torch.no_grad():
        out = model(**inputs, return_dict=False)[0]  # the CP output hook gathers tensors, not output dataclasses
    torch.testing.assert_close(out, native, atol=1e-5, rtol=1e-5)


def run(rank: int, world: int, init_file: str, result_dir: str) -> None:
    import torch.distributed as dist

    from winattn.integrations import install_torchvision_shim

    install_torchvision_shim()
    import winattn.integrations.diffusers as wd

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        wd.register()
        wd.load_backend()
        done = []
        for name, fn in (
            ("ring", lambda: _check_dispatch(rank, world, world, 1, False)),
            ("ulysses", lambda: _check_dispatch(rank, world, 1, world, False)),
            ("ulysses_key_padding", lambda: _check_dispatch(rank, world, 1, world, True)),
            ("flux_ring", lambda: _check_model(rank, world)),
        ):
            fn()
            done.append(name)
        with open(os.path.join(result_dir, f"rank{rank}.ok"), "w") as f:
            f.write("\n".join(done))
    except BaseException:
        with open(os.path.join(result_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()
