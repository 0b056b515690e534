"""diffusers context parallelism (ring and Ulysses attention) on the window_attn_hub backend: 2 CPU processes
(torch.multiprocessing spawn, gloo), kernel from the embedded Hub. The rank body is in _cp_worker.py."""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp

from ._cp_worker import run


@pytest.mark.slow
def test_ring_and_ulysses_attention_on_two_processes(hub_repo, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    try:
        mp.spawn(run, args=(2, str(tmp_path / "init"), str(results)), nprocs=2, join=True)
    except Exception:
        errors = "\n".join(p.read_text() for p in sorted(results.glob("*.err")))
        pytest.fail(f"a rank failed:\n{errors}")
    for rank in range(2):
        done = (results / f"rank{rank}.ok").read_text().split()
        assert done == ["ring", "ulysses", "ulysses_key_padding", "flux_ring"]
