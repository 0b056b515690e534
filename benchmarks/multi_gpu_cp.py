"""diffusers context parallelism (ring and Ulysses) with the `window_attn_hub` backend: NCCL on GPUs, gloo on CPU.

Run with one process per GPU, the clients pointed at a Hub that holds the CUDA variant (see README "Multi-GPU"):

    torchrun --nproc-per-node 2 benchmarks/multi_gpu_cp.py --out results/multi_gpu_cp.json

Dry run on CPU, 2 processes over gloo, the CPU variant (`make build`) published to a local Hub the same way:

    python -m winattn hub serve --root /tmp/hub --port 8765 --token T --trusted-org winattn &
    python -m winattn publish --build-dir build --endpoint http://127.0.0.1:8765 --token T
    export HF_ENDPOINT=http://127.0.0.1:8765
    torchrun --nproc-per-node 2 benchmarks/multi_gpu_cp.py --backend gloo --device cpu --skip-timing --out /tmp/cp.json

Checks, in bf16 on every rank, each compared tensor by the FlashAttention rule against a float32 reference:
err(cp) <= 2 * err(one device) + 2 bf16 quanta, err = max |x - reference|, quantum = bf16 eps * max |reference|.
  * dispatcher level, S=1024, H=8, D=64: ring and Ulysses output shard and q/k/v gradient shards against the same
    full-sequence call on one device (reference: float32 SDPA), without and with a [B, S] key-padding mask;
  * model level, forward + backward with the same random upstream gradient: a tiny Flux transformer (no mask) and a
    tiny QwenImage transformer whose `encoder_hidden_states_mask` reaches the dispatcher as a [B, 1, 1, S] bool
    key-padding mask, with `enable_parallelism` (ring, Ulysses) against the same bf16 weights on one device
    (reference: the model in float32 with the same bf16-rounded weights and inputs, `native` attention). Compared: the
    output, the gradient of the input hidden_states and the gradient of every parameter. Each rank's parameter
    gradients cover only its sequence shard (diffusers all-reduces nothing), so they are summed over ranks first;
    `params` reports every parameter and the worst one (also by max |g_cp - g_one| / max |g_one|).
Masks under ring attention are refused by the backend with a ValueError: that refusal is the expected outcome there.
Then (unless --skip-timing) times one attention step (forward + backward) at S=32k, H=24, D=128 on one device and on
all of them (ring, Ulysses). Keep NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 set on
shared machines.
"""

import argparse
import copy
import json
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist

BF16_EPS = torch.finfo(torch.bfloat16).eps


def _cp_config(device, ring, ulysses):
    """ContextParallelConfig over a ("ring", "ulysses") mesh of `device`'s type."""
    from diffusers.models._modeling_parallel import ContextParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    cp = ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses)
    cp.mesh = init_device_mesh(device.type, cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    return cp


def _config(rank, world, device, ring, ulysses):
    from diffusers.models._modeling_parallel import ParallelConfig

    cp = _cp_config(device, ring, ulysses)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(rank, world, device, mesh=cp.mesh)
    return config


def _inputs(S, H, D, device, seed=7):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(1, S, H, D, generator=g).to(device) for _ in range(3)]


def _attend(qkv, mask, config):
    from diffusers.models import attention_dispatch as ad

    return ad.dispatch_attention_fn(*qkv, attn_mask=mask, backend=ad.AttentionBackendName("window_attn_hub"),
                                    parallel_config=config)


def _compare(got, single, exact):
    """FlashAttention rule for one tensor: CP result `got`, one-device result `single`, float32 reference `exact`."""
    got, single, exact = got.float(), single.float(), exact.detach().float()
    err = (got - exact).abs().max().item()
    base = (single - exact).abs().max().item()
    bound = 2 * base + 2 * BF16_EPS * exact.abs().max().item()
    diff = (got - single).abs().max().item()
    return {"err_cp": err, "err_one_device": base, "bound": bound, "ok": err <= bound,
            "max_abs_cp_minus_one_device": diff,
            "rel_cp_minus_one_device": diff / max(single.abs().max().item(), torch.finfo(torch.float32).tiny)}


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
    one_in = [t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v)]  # full sequence, one device
    one = _attend(one_in, keep if masked else None, None)
    one.backward(g.to(torch.bfloat16))
    cp_in = [t[:, part].to(torch.bfloat16).contiguous().requires_grad_(True) for t in (q, k, v)]
    cp = _attend(cp_in, keep[:, part] if masked else None, _config(rank, world, device, ring, ulysses))
    cp.backward(g[:, part].to(torch.bfloat16))

    result = {"out": _compare(cp, one[:, part], ref[:, part])}
    for n, c, o, r in zip("qkv", cp_in, one_in, ref_in):
        result[f"d{n}"] = _compare(c.grad, o.grad[:, part], r.grad[:, part])
    result["ok"] = all(r["ok"] for r in result.values())
    return result


# Tiny transformers (head dim 64, 2 heads: Ulysses over at most 2 ranks), float32 on CPU, and their inputs.
def flux():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                   attention_head_dim=64, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(16, 24, 24))
    gen = torch.Generator().manual_seed(3)
    inputs = dict(hidden_states=torch.randn(1, 64, 4, generator=gen),
                  encoder_hidden_states=torch.randn(1, 16, 32, generator=gen),
                  pooled_projections=torch.randn(1, 32, generator=gen), timestep=torch.ones(1),
                  img_ids=torch.randn(64, 3, generator=gen), txt_ids=torch.zeros(16, 3))
    return model, inputs


def qwenimage_masked():
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=1,
                                        attention_head_dim=64, num_attention_heads=2, joint_attention_dim=32,
                                        axes_dims_rope=(16, 24, 24))
    gen = torch.Generator().manual_seed(3)
    text_mask = torch.ones(2, 16, dtype=torch.long)
    text_mask[1, 11:] = 0  # padded text tokens of sample 1 (on the last rank's text shard under 2-way CP)
    inputs = dict(hidden_states=torch.randn(2, 64, 16, generator=gen),
                  encoder_hidden_states=torch.randn(2, 16, 32, generator=gen), encoder_hidden_states_mask=text_mask,
                  timestep=torch.ones(2), img_shapes=[(1, 8, 8)] * 2)
    return model, inputs


MODELS = {"flux": flux, "qwenimage_masked": qwenimage_masked}


def check_model(rank, world, device, ring, ulysses, build):
    """Forward + backward of a tiny transformer under CP against one device; see the module docstring."""
    base, inputs = build()
    one = copy.deepcopy(base).to(device, torch.bfloat16)
    ref = copy.deepcopy(one).float()  # the bf16 weights, computed in float32 (`native` attention)
    parallel = copy.deepcopy(one)
    one.set_attention_backend("window_attn_hub")
    parallel.set_attention_backend("window_attn_hub")
    parallel.enable_parallelism(config=_cp_config(device, ring, ulysses))

    def cast(key, value, dtype):  # activations rounded to bf16 for every model; position ids and masks as they are
        if not torch.is_tensor(value):
            return value
        if value.is_floating_point() and not key.endswith("_ids"):
            return value.to(device, torch.bfloat16).to(dtype)
        return value.to(device)

    def run(model):
        dtype = next(model.parameters()).dtype
        x = {k: cast(k, v, dtype) for k, v in inputs.items()}
        x["hidden_states"].requires_grad_(True)
        out = model(**x, return_dict=False)[0]  # the CP output hook gathers tensors, not output dataclasses
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(11)).to(device, torch.bfloat16)
        out.backward(g.to(dtype))
        grads = {"dhidden_states": x["hidden_states"].grad}
        grads.update({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        return out, {n: g.float() for n, g in grads.items()}

    exact, exact_grads = run(ref)
    single, single_grads = run(one)
    got, got_grads = run(parallel)
    if got_grads.keys() != single_grads.keys() or exact_grads.keys() != single_grads.keys():
        raise RuntimeError(f"parameters with gradients differ: {sorted(set(got_grads) ^ set(single_grads))}")
    for g in got_grads.values():  # each rank holds only its sequence shard's share (nothing all-reduces): sum them
        dist.all_reduce(g)

    result = {"out": _compare(got, single, exact)}
    result["dhidden_states"] = _compare(*(d.pop("dhidden_states") for d in (got_grads, single_grads, exact_grads)))
    params = {n: _compare(got_grads[n], single_grads[n], exact_grads[n]) for n in exact_grads}
    worst = max(params, key=lambda n: params[n]["err_cp"] / max(params[n]["bound"], 1e-30))
    worst_rel = max(params, key=lambda n: params[n]["rel_cp_minus_one_device"])
    result["params"] = {"count": len(params), "ok": all(p["ok"] for p in params.values()),
                        "worst_vs_bound": {"name": worst, **params[worst]},
                        "max_rel_cp_minus_one_device": {"name": worst_rel,
                                                        "value": params[worst_rel]["rel_cp_minus_one_device"]},
                        "per_param": params}
    result["ok"] = result["out"]["ok"] and result["dhidden_states"]["ok"] and result["params"]["ok"]
    return result


def _record(checks, key, refusal_expected, fn, *args):
    try:
        checks[key] = fn(*args)
    except ValueError as e:  # a documented refusal (masks under ring attention), not a wrong answer
        checks[key] = {"refused": str(e), "ok": refusal_expected}
    except Exception as e:  # record and go on: each case is reported on its own
        checks[key] = {"error": f"{type(e).__name__}: {e}", "ok": False}


def time_step(qkv, mask, config, reps=5, warmup=2):
    """Median ms of one forward + backward; with a parallel config every rank runs it (aligned by a barrier)."""
    cuda = qkv[0].is_cuda
    g = torch.randn_like(qkv[0])
    times = []
    for i in range(warmup + reps):
        ins = [t.detach().requires_grad_(True) for t in qkv]
        if config is not None:
            dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        _attend(ins, mask, config).backward(g)
        if cuda:
            end.record()
            torch.cuda.synchronize()
        ms = start.elapsed_time(end) if cuda else (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/multi_gpu_cp.json")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--skip-timing", action="store_true", help="run the checks only")
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        name = torch.cuda.get_device_name(device)
    else:
        device, name = torch.device("cpu"), platform.processor() or platform.machine()
        # diffusers' enable_parallelism picks `torch.device(<accelerator>, rank % torch.accelerator.device_count())`,
        # which divides by zero without accelerators; the mesh it uses is ours (`_cp_config`), of type cpu.
        if torch.accelerator.device_count() == 0:
            torch.accelerator.device_count = lambda: 1
    dist.init_process_group(args.backend, device_id=device if args.device == "cuda" else None)

    from winattn.integrations import install_torchvision_shim

    install_torchvision_shim()  # a no-op unless CPU torch sits beside the cu130 torchvision wheel
    import winattn.integrations.diffusers as wd

    wd.register()
    wd.load_backend()
    report = {"world": world, "backend": args.backend, "device": name, "checks": {}, "timing_ms": {}}
    cases = [("ring", world, 1), ("ulysses", 1, world)]
    for case, ring, ulysses in cases:
        for masked in (False, True):
            _record(report["checks"], f"{case}{'_key_padding' if masked else ''}", masked and ring > 1,
                    check_dispatch, rank, world, device, ring, ulysses, masked)
        for model, build in MODELS.items():
            _record(report["checks"], f"{model}_{case}", "masked" in model and ring > 1,
                    check_model, rank, world, device, ring, ulysses, build)

    if not args.skip_timing:
        S, H, D = args.seq, args.heads, args.head_dim
        full = [t.to(torch.bfloat16) for t in _inputs(S, H, D, device, seed=1)]
        shard = [t[:, rank * S // world:(rank + 1) * S // world].contiguous() for t in full]
        report["shape"] = {"B": 1, "S": S, "H": H, "D": D, "dtype": "bf16"}
        one = time_step(full, None, None) if rank == 0 else None
        dist.barrier()
        report["timing_ms"]["1_device"] = one
        for case, ring, ulysses in cases:
            report["timing_ms"][f"{world}_devices_{case}"] = time_step(
                shard, None, _config(rank, world, device, ring, ulysses))

    if rank == 0:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(json.dumps(report, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
