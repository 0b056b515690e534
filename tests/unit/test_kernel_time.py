"""benchmarks/kernel_time.py without a GPU: its command line and the kernel names it prints (the timing itself needs
CUPTI on the H200: RESULTS v3.9)."""

import pytest

from repo_modules import load_repo_module


@pytest.fixture(scope="module")
def kt():
    return load_repo_module("benchmarks/kernel_time.py")


def test_kernel_names_are_shortened_to_what_tells_them_apart(kt):
    name = ("void sm90::fwd_pipelined_kernel_sm90<sm90::FwdPipeTraitsSm90<64, 128, 3, 0>, __nv_bfloat16, 0>"
            "(sm90::FwdPipeParams)")
    assert kt.short_name(name) == "fwd_pipelined_kernel_sm90"
    assert kt.short_name("void winattn::cuda::mask_bits_transposed4_kernel(unsigned int*, ...)") == \
        "mask_bits_transposed4_kernel"
    assert kt.short_name("Memset (Device)") == "Memset "


def test_rows_and_variant_are_required(kt, capsys):
    with pytest.raises(SystemExit):
        kt.main(["--variant", "build/x"])  # (no --only)
    assert "--only" in capsys.readouterr().err


def test_host_events_line_names_the_longest_and_what_no_event_covers(kt):
    events = [("cudaLaunchKernel", 7.0, 2.0), ("_window_attention_cuda_s17a::fwd", 5.5, 1.0),
              ("aten::empty_strided", 2.0, 3.0), ("cudaGetDevice", 0.4, 4.0)]
    line = kt.format_host_events(events, 20.0, top=3)
    assert line == ("host 20.0 us: cudaLaunchKernel 7.0 x2, fwd 5.5, empty_strided 2.0 x3; "
                    "outside events 5.1")
    assert kt.format_host_events([], 3.0).endswith("outside events 3.0")


def test_a_forced_run_can_go_first(kt):
    assert kt.ours_labels("", False) == ["ours"] and kt.ours_labels("", True) == ["ours"]
    assert kt.ours_labels("fwd_v3_per_tile", False) == ["ours", "ours_b"]
    assert kt.ours_labels("fwd_v3_per_tile", True) == ["ours_b", "ours"]
