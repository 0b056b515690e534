"""scripts/kt_summary.py: the means of a gpu_variants.sh call's kernel-time rounds, per row and variant."""

import pytest

from repo_modules import load_repo_module

# (the shape of benchmarks/kernel_time.py's output inside a gpu_variants.sh call, peers and warnings included)
ROUNDS = """#### base (round 1)
row                        impl       pass kernels ms  host ms  longest kernels (ms per call)
/opt/torch/profiler.py:224: UserWarning: Warning: Profiler clears events
flux1_joint                ours       fwd       0.400    0.075  fwd_pipelined_kernel_sm90 0.400
flux1_joint                ours       f+b       1.600    0.469  bwd_pipelined_kernel_sm90 1.168, fwd 0.404
flux1_joint                cudnn      fwd       0.300    0.038  cudnn_generated_fort_native_sdpa_sm90_fl 0.301
#### new (round 1)
row                        impl       pass kernels ms  host ms  longest kernels (ms per call)
flux1_joint                ours       fwd       0.380    0.040  fwd_pipelined_kernel_sm90 0.380
#### base (round 2)
flux1_joint                ours       fwd       0.420    0.075  fwd_pipelined_kernel_sm90 0.420
flux1_joint                ours       f+b       1.700    0.469  bwd_pipelined_kernel_sm90 1.168, fwd 0.404
#### new (round 2)
flux1_joint                ours       fwd       0.400    0.040  fwd_pipelined_kernel_sm90 0.400
"""


@pytest.fixture(scope="module")
def kts():
    return load_repo_module("scripts/kt_summary.py")


def test_rounds_are_read_per_variant_without_the_peers(kts):
    variants, times = kts.parse(ROUNDS)
    assert variants == ["base", "new"]
    assert times[("flux1_joint", "fwd", "base")] == [0.4, 0.42]
    assert times[("flux1_joint", "fwd", "new")] == [0.38, 0.4]
    assert times[("flux1_joint", "f+b", "base")] == [1.6, 1.7]
    assert ("flux1_joint", "f+b", "new") not in times


def test_summary_gives_means_rounds_and_the_change_against_the_first_variant(kts):
    out = kts.summary(ROUNDS)
    fwd = out.split("f+b:")[0]
    assert "base 0.410 (0.400, 0.420)" in fwd
    assert "new 0.390 (0.380, 0.400) -4.9%" in fwd  # 0.390 / 0.410 - 1
    fb = out.split("f+b:")[1]
    assert "base 1.650 (1.600, 1.700)" in fb and "new -" in fb


def test_no_rounds_and_bad_usage(kts, tmp_path, capsys):
    assert kts.summary("nothing here") == "no rounds found"
    assert kts.main([]) == 2
    f = tmp_path / "kernel_time.txt"
    f.write_text(ROUNDS)
    assert kts.main([str(f)]) == 0
    assert "change against base" in capsys.readouterr().out
