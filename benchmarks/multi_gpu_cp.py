"""diffusers context parallelism (ring and Ulysses) over NCCL with the `window_attn_hub` backend.

Run with one process per GPU, the clients pointed at a Hub that holds the CUDA variant (see README
"Multi-GPU"):

    torchrun --nproc-per-node 2 benchmarks/multi_gpu_cp.py --out results/multi_gpu_cp.json

Checks, in bf16 on every rank:
  * dispatcher level, S=1024, H=8, D=64: ring and Ulysses output shard and q/k/v gradient shards against the same
    full-sequence call on one GPU (FlashAttention rule against a float32 SDPA reference:
    err(cp) <= 2 * err(one GPU) + 2 bf16 quanta), without and with a [B, S] key-padding mask;
  * model level: a tiny Flux transformer with `enable_parallelism` (ring, Ulysses) against itself on one GPU.
Then times one attention step (forward + backward) at S=32k, H=24, D=128 on 1 GPU and on all GPUs (ring, Ulysses).
Keep NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 set on shared machines.
"""

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

BF16_EPS = torch.finfo(torch.bfloat16).eps


def _config(rank, world, device, ring, ulysses):
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    cp = ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses)
    mesh = init_device_mesh("cuda", cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(rank, world, device, mesh=mesh)
    return config


def _inputs(S, H, D, device, seed=7):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(1, S, H, D, generator=g).to(device) for _ in range(3)]


def _attend(qkv, mask, config):
    from diffusers.models import attention_dispatch as ad

    return ad.dispatch_attention_fn(*qkv, attn_mask=mask, backend=ad.AttentionBackendName("window_attn_hub"),
                                    parallel_config=config)


def check_dispatch(rank, world, device, ring, ulysses, masked, S=1024, H=8, D=64):
    q, k, v = _inputs(S, H, D, device)
    keep = torch.ones(1, S, dtype=torch.bool, device=device)
    if masked:
        keep[:, S - S // 5:] = False
    part = slice(rank * S // world, (rank + 1) * S // world)
    g = torch.randn(1, S, H, D, generator=torch.Generator().manual_seed(11)).to(device)

    ref_in = [t.clone().requires_grad_(True) for t in (q, k, v)]  # float32 SDPA reference
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in ref_in), attn_mask=keep[:, None, None, :] if masked else None).transpose(1, 2)
    ref.backward(g)
    one_in = [t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v)]  # full sequence, one GPU
    one = _attend(one_in, keep if masked else None, None)
    one.backward(g.to(torch.bfloat16))
    cp_in = [t[:, part].to(torch.bfloat16).contiguous().requires_grad_(True) for t in (q, k, v)]
    cp = _attend(cp_in, keep[:, part] if masked else None, _config(rank, world, device, ring, ulysses))
    cp.backward(g[:, part].to(torch.bfloat16))

    result = {}
    pairs = [("out", cp, one[:, part], ref[:, part])]
    pairs += [(f"d{n}", c.grad, o.grad[:, part], r.grad[:, part]) for n, c, o, r in zip("qkv", cp_in, one_in, ref_in)]
    for name, got, single, exact in pairs:
        exact = exact.detach().float()
        err = (got.float() - exact).abs().max().item()
        base = (single.float() - exact).abs().max().item()
        bound = 2 * base + 2 * BF16_EPS * exact.abs().max().item()
        result[name] = {"err_cp": err, "err_one_gpu": base, "bound": bound, "ok": err <= bound,
                        "max_abs_cp_minus_one_gpu": (got.float() - single.float()).abs().max().item()}
    return result


def check_model(rank, world, device, ring, ulysses):
    from diffusers import FluxTransformer2DModel
    from diffusers.models._modeling_parallel import ContextParallelConfig

    def build():
        torch.manual_seed(0)
        return FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                      attention_head_dim=64, num_attention_heads=2, joint_attention_dim=32,
                                      pooled_projection_dim=32, axes_dims_rope=(16, 24, 24)).to(device, torch.bfloat16)

    gen = torch.Generator().manual_seed(3)
    inputs = dict(hidden_states=torch.randn(1, 64, 4, generator=gen), encoder_hidden_states=torch.randn(1, 16, 32, generator=gen),
                  pooled_projections=torch.randn(1, 32, generator=gen), timestep=torch.ones(1),
                  img_ids=torch.randn(64, 3, generator=gen), txt_ids=torch.zeros(16, 3))
    inputs = {k: (v.to(device, torch.bfloat16) if v.is_floating_point() and k not in ("img_ids", "txt_ids")
                  else v.to(device)) for k, v in inputs.items()}
    single = build()
    single.set_attention_backend("window_attn_hub")
    with torch.no_grad():
        one = single(**inputs, return_dict=False)[0].float()
    parallel = build()
    parallel.set_attention_backend("window_attn_hub")
    parallel.enable_parallelism(config=ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses))
    with torch.no_grad():
        out = parallel(**inputs, return_dict=False)[0].float()
    diff = (out - one).abs().max().item()
    bound = 8 * BF16_EPS * one.abs().max().item()  # same kernel, same weights: only the merge order differs
    return {"max_abs_diff": diff, "bound": bound, "ok": diff <= bound}


def time_step(qkv, mask, config, reps=5, warmup=2):
    """Median ms of one forward + backward; with a parallel config every rank runs it (aligned by a barrier)."""
    g = torch.randn_like(qkv[0])
    times = []
    for i in range(warmup + reps):
        ins = [t.detach().requires_grad_(True) for t in qkv]
        if config is not None:
            dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _attend(ins, mask, config).backward(g)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/multi_gpu_cp.json")
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.backends.cuda.matmul.allow_tf32 = False

    import winattn.integrations.diffusers as wd

    wd.register()
    wd.load_backend()
    report = {"world": world, "gpu": torch.cuda.get_device_name(device), "checks": {}, "timing_ms": {}}
    cases = [("ring", world, 1), ("ulysses", 1, world)]
    for name, ring, ulysses in cases:
        for masked in (False, True):
            key = f"{name}{'_key_padding' if masked else ''}"
            try:
                report["checks"][key] = check_dispatch(rank, world, device, ring, ulysses, masked)
            except ValueError as e:  # a documented refusal (masks under ring attention), not a wrong answer
                report["checks"][key] = {"refused": str(e), "ok": masked and ring > 1}
            except Exception as e:  # record and go on: each case is reported on its own
                report["checks"][key] = {"error": f"{type(e).__name__}: {e}"}
        try:
            report["checks"][f"flux_{name}"] = check_model(rank, world, device, ring, ulysses)
        except Exception as e:
            report["checks"][f"flux_{name}"] = {"error": f"{type(e).__name__}: {e}"}

    S, H, D = args.seq, args.heads, args.head_dim
    full = [t.to(torch.bfloat16) for t in _inputs(S, H, D, device, seed=1)]
    shard = [t[:, rank * S // world:(rank + 1) * S // world].contiguous() for t in full]
    report["shape"] = {"B": 1, "S": S, "H": H, "D": D, "dtype": "bf16"}
    one = time_step(full, None, None) if rank == 0 else None
    dist.barrier()
    report["timing_ms"]["1_gpu"] = one
    for name, ring, ulysses in cases:
        report["timing_ms"][f"{world}_gpu_{name}"] = time_step(shard, None, _config(rank, world, device, ring, ulysses))

    if rank == 0:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(json.dumps(report, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
