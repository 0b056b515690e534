"""`HF_HUB_DISABLE_TELEMETRY=1` (hub-protocol.md §6, pitfall 1): kernels 0.17.2 then sends a User-Agent with a
trailing space ("...; python/3.11.7; ") that httpx refuses, so its own Hub calls fail. winattn's calls go through
their own `HfApi` (`library_name="winattn"`, a non-empty user agent): `winattn.load`, `winattn info` and the diffusers
backend work with it set; `kernels.get_kernel` and the `kernels` CLI do not (README, "Distribution", says so). One
fresh interpreter, since huggingface_hub reads the variable at import."""

import subprocess
import sys

from .conftest import child_env

SCRIPT = r"""
import subprocess, sys, torch
import winattn
m = winattn.load("winattn/window-attention", version=1)
print("winattn.load:", m.__winattn_info__.source)

import diffusers
import winattn.integrations.diffusers as wd
wd.register()
t = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
    attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
    axes_dims_rope=(4, 4, 8))
t.set_attention_backend("window_attn_hub")
print("diffusers backend:", wd._BACKENDS["window_attn_hub"].module.__winattn_info__.source)

r = subprocess.run([sys.executable, "-m", "winattn", "info"], capture_output=True, text=True)
print("winattn info:", r.returncode, r.stdout.splitlines()[2] if r.returncode == 0 else r.stderr)

import os
kernels_cli = os.path.join(os.path.dirname(sys.executable), "kernels")
r = subprocess.run([kernels_cli, "versions", "winattn/window-attention"], capture_output=True, text=True)
print("kernels versions:", r.returncode, r.stderr.strip().splitlines()[-1])

import kernels
try:
    kernels.get_kernel("winattn/window-attention", version=1)
    print("kernels.get_kernel: loaded")
except Exception as e:
    print("kernels.get_kernel:", type(e).__name__, e)
"""


def test_telemetry_off_affects_kernels_calls_not_winattn(hub_repo):
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=child_env({"HF_HUB_DISABLE_TELEMETRY": "1"}),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "winattn.load: hub" in out and "diffusers backend: hub" in out
    assert "winattn info: 0 would load: torch-stable-abi210-cpu-x86_64-linux" in out
    # kernels 0.17.2's bug; fails loudly once kernels fixes it (then the README's note goes)
    assert "kernels.get_kernel: ValueError" in out and "could not verify publisher trust status" in out
    assert "kernels versions: 1 " in out and "Illegal header value b'kernels/0.17.2; " in out
