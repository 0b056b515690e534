"""benchmarks/bench_shapes.py without a GPU: the row table, --list, the output lines, and a dry run of a few rows on
the CPU build (every peer's call is accepted and agrees with ours). Speed is only measured on the H200."""

from pathlib import Path

import pytest
import torch

from repo_modules import load_repo_module

FLOAT_FORMS = {"1HQK", "BHQK", "B11K", "B1QK", "1H1K"}
BOOL_FORMS = {"1HQK", "BHQK", "B11K", "B1QK", "1H1K", "11QK"}


@pytest.fixture(scope="module")
def bs():
    return load_repo_module("benchmarks/bench_shapes.py")


def test_rows_are_consistent_and_named_once(bs):
    assert len(bs.ROWS) >= 40
    assert len({r.name for r in bs.ROWS}) == len(bs.ROWS)
    for row in bs.ROWS:
        assert bs.row_problems(row) == [], row.name
        assert bs.row_problems(bs.shrink(row)) == [], f"{row.name} shrunk"
    assert {r.cls for r in bs.ROWS} == set(bs.CLASSES)


def test_rows_cover_every_term_form(bs):
    terms = [t for r in bs.ROWS for t in r.terms]
    floats = {t.shape for t in terms if t.kind in ("bias", "fmask")}
    assert FLOAT_FORMS <= floats
    assert BOOL_FORMS <= {t.shape for t in terms if t.kind == "mask"}
    assert {"fp32", "bf16", "fp16"} <= {t.dtype for t in terms if t.kind in ("bias", "fmask")}
    assert set(bs.FILLS) <= {t.fill for t in terms if t.kind == "fmask"}
    assert {"kpm", "table", "shift"} <= {t.kind for t in terms}
    biases = [t for t in terms if t.kind == "bias"]
    assert any(t.grad for t in biases) and any(not t.grad for t in biases)
    assert any(r.qkv_grad for r in bs.ROWS) and any(not r.trains for r in bs.ROWS)
    assert any(r.causal and r.hkv < r.H for r in bs.ROWS)
    assert any(r.window is not None for r in bs.ROWS)
    assert any(r.Sq == 1 for r in bs.ROWS) and any(r.dtype == "fp16" for r in bs.ROWS)


def test_list_prints_every_row_without_a_gpu(bs, capsys):
    cuda_before = torch.cuda.is_initialized()
    assert bs.main(["--list"]) == 0
    out = capsys.readouterr().out
    for row in bs.ROWS:
        assert f"\n{row.name} " in out
    assert f"{len(bs.ROWS)} rows: " in out.splitlines()[-1]
    assert torch.cuda.is_initialized() == cuda_before


def _fake(bs, name, ours, peers, learns=False, labels=("ours",)):
    """A row result as run_row makes it, from (fwd_ms, fb_ms) pairs; peers as name -> (fwd, fb, dbias)."""
    res = {"name": name, "impls": {}, "peers": {}}
    for label, (f, fb) in zip(labels, ours):
        res["impls"][label] = {"fwd_ms": f, "fb_ms": fb} if f else {"error": "RuntimeError: boom"}
    for pname, (f, fb, dbias) in peers.items():
        res["peers"][pname] = {"fwd_ms": f, "fb_ms": fb, "dbias": dbias, "max_abs_diff": 0.001}
    res["peers"]["fa4"] = {"skipped": "FA4 (flash_attn_func) takes no bias or mask"}
    bs.compare(res, list(labels), learns, 0.05)
    return res


def test_ratios_best_peers_and_summary_line(bs):
    results = [
        _fake(bs, "a", [(1.0, 3.0)], {"cudnn": (0.5, 4.0, False), "efficient": (2.0, 6.0, True)}, learns=True),
        _fake(bs, "b", [(1.0, 2.0)], {"cudnn": (2.0, 1.0, False)}),
        _fake(bs, "c", [(None, None)], {"cudnn": (1.0, 1.0, False)}),  # ours failed: counts below
        _fake(bs, "d", [(1.0, 2.0)], {}),  # no peer ran: not counted
    ]
    a = results[0]
    assert a["best_peer"] == {"fwd": "cudnn", "fb": "cudnn"} and a["best_peer_dbias"] == "efficient"
    assert a["vs_best"]["ours"] == {"fwd": 0.5, "fb": 4.0 / 3.0, "fb_dbias": 2.0}
    assert results[2]["vs_best"]["ours"] == {"fwd": 0.0, "fb": 0.0}
    assert bs.summary_line(results, "ours") == ("rows below 1.0x best peer: 2 of 3 (fwd), 2 of 3 (fwd+bwd); "
                                                "host-paced among them: 0 (fwd), 0 (fwd+bwd)")
    line = bs.format_row(a, ["ours"], ["cudnn", "efficient", "fa4"])
    assert "fwd 0.50x cudnn" in line and "dB 2.00x efficient" in line


def test_host_paced_ratios_are_marked_and_counted(bs):
    """A ratio reads the host's pace when ours or its best peer took about as long to issue a call (host ms) as the
    events measured; such rows are marked and counted apart, the ratio itself unchanged."""
    paced = _fake(bs, "short", [(0.08, 0.4)], {"cudnn": (0.04, 0.3, False)})
    paced["impls"]["ours"].update(fwd_host_ms=0.078, fb_host_ms=0.2)  # forward host-paced, f+b not
    paced["peers"]["cudnn"].update(fwd_host_ms=0.01, fb_host_ms=0.1)
    bs.compare(paced, ["ours"], False, 0.05)
    by_peer = _fake(bs, "peer", [(0.1, 0.4)], {"cudnn": (0.05, 0.2, False)})
    by_peer["impls"]["ours"].update(fwd_host_ms=0.01, fb_host_ms=0.01)
    by_peer["peers"]["cudnn"].update(fwd_host_ms=0.01, fb_host_ms=0.19)  # the peer's f+b read its host
    bs.compare(by_peer, ["ours"], False, 0.05)
    kernel = _fake(bs, "kernel", [(1.0, 4.0)], {"cudnn": (0.5, 3.0, False)})  # no host ms (CPU dry run): not paced
    assert paced["host_paced"]["ours"] == ["fwd"] and by_peer["host_paced"]["ours"] == ["fb"]
    assert kernel["host_paced"]["ours"] == [] and paced["vs_best"]["ours"]["fwd"] == 0.5
    line = bs.format_row(paced, ["ours"], ["cudnn"])
    assert "fwd 0.50x cudnn (host)" in line and "f+b 0.75x cudnn  " in line
    assert bs.summary_line([paced, by_peer, kernel], "ours") == (
        "rows below 1.0x best peer: 3 of 3 (fwd), 3 of 3 (fwd+bwd); host-paced among them: 1 (fwd), 1 (fwd+bwd)")


def test_kernel_time_of_host_paced_ratios(bs):
    """--kernel-time: each host-paced forward / f+b ratio measured again in kernel time, ours and that direction's
    best peer (each name and direction once), shown beside the event ratio and counted in the summary."""
    row = _fake(bs, "short", [(0.08, 0.4)], {"cudnn": (0.04, 0.3, False)})
    row["impls"]["ours"].update(fwd_host_ms=0.078, fb_host_ms=0.39)  # both directions host-paced
    row["peers"]["cudnn"].update(fwd_host_ms=0.01, fb_host_ms=0.1)
    bs.compare(row, ["ours"], False, 0.05)
    calls = []
    kernel = {("ours", "fwd"): 0.010, ("cudnn", "fwd"): 0.011, ("ours", "fb"): 0.084, ("cudnn", "fb"): 0.069}

    def measure(name, d):
        calls.append((name, d))
        return kernel[(name, d)]

    bs.kernel_ratios(row, ["ours"], measure)
    assert sorted(calls) == sorted(kernel)
    assert row["vs_best_kernels"]["ours"] == {"fwd": 0.011 / 0.010, "fb": 0.069 / 0.084}
    line = bs.format_row(row, ["ours"], ["cudnn"])
    assert "fwd 0.50x cudnn (host; kernels 1.10x)" in line and "f+b 0.75x cudnn (host; kernels 0.82x)" in line
    assert bs.summary_line([row], "ours").endswith(
        "host-paced among them: 1 (fwd), 1 (fwd+bwd); of those, below 1.0x in kernel time: 0 of 1 (fwd), 1 of 1 "
        "(fwd+bwd)")
    failing = _fake(bs, "fails", [(0.08, 0.4)], {"cudnn": (0.04, 0.3, False)})
    failing["impls"]["ours"].update(fwd_host_ms=0.078, fb_host_ms=0.1)
    bs.compare(failing, ["ours"], False, 0.05)
    bs.kernel_ratios(failing, ["ours"], lambda name, d: 1 / 0)  # recorded, not raised
    assert failing["vs_best_kernels"]["ours"] == {} and "ZeroDivisionError" in failing["kernel_errors"][0]
    assert "fwd 0.50x cudnn (host)" in bs.format_row(failing, ["ours"], ["cudnn"])


def test_variant_b_adds_its_column_and_the_last_summary_line(bs):
    labels = ("ours", "ours_b")
    results = [_fake(bs, "a", [(1.0, 4.0), (0.5, 4.0)], {"cudnn": (0.8, 3.0, False)}, labels=labels),
               _fake(bs, "b", [(1.0, 4.0), (1.0, 2.0)], {"cudnn": (2.0, 5.0, False)}, labels=labels)]
    assert results[0]["b_over_a"] == {"fwd": 2.0, "fb": 1.0}
    lines = bs.summaries(results, list(labels))
    assert lines == ["rows below 1.0x best peer: 1 of 2 (fwd), 1 of 2 (fwd+bwd); host-paced among them: 0 (fwd), 0 "
                     "(fwd+bwd)",
                     "variant B: rows below 1.0x best peer: 0 of 2 (fwd), 1 of 2 (fwd+bwd); host-paced among them: 0 "
                     "(fwd), 0 (fwd+bwd)"]
    assert "B/A" in bs.header(list(labels), ["cudnn"])
    assert "2.00" in bs.format_row(results[0], list(labels), ["cudnn"])


@pytest.mark.parametrize("name", ["beit_b16_fp32", "swin_t_w7", "mistral_7b_swa", "llama3_8b_hf_fmask_b1qk"])
def test_dry_run_peers_agree_with_ours(bs, kernel, name):
    """Each row's calls on the CPU build: SDPA math for the SDPA peers, eager Flex (forward only), FA4 skipped."""
    if kernel.BUILD_DEVICE != "cpu":
        pytest.skip("the dry run takes the CPU build")
    row = bs.shrink(next(r for r in bs.ROWS if r.name == name))
    opt = bs.Options(reps=1, device="cpu", fwd_only=("flex",))
    res = bs.run_row(row, {"ours": kernel}, bs.PEERS, opt)
    assert "fb_ms" in res["impls"]["ours"], res["impls"]["ours"]
    for pname, rec in res["peers"].items():
        if pname == "fa4" or (pname == "fa2" and (row.terms or row.window)):
            assert "skipped" in rec
            continue
        assert rec.get("max_abs_diff", 1.0) < 1e-4, (pname, rec)
    assert res["peers"]["efficient"]["dbias"] == row.learns
    assert res["check"]["ok"]


def test_a_discarded_warm_up_run_then_both_builds_in_both_positions(bs, kernel, monkeypatch):
    """A warm-up run of ours that is not recorded, then A, B, B, A: the first timed run of a row reads faster on the
    H200 whichever build it is (RESULTS v3.8, v4.3)."""
    if kernel.BUILD_DEVICE != "cpu":
        pytest.skip("the dry run takes the CPU build")
    timed = []

    def fake_measure(call, leaves, reps, device):
        timed.append(call)
        return {"setup_s": 0.0, "fwd_ms": float(len(timed)), "fb_ms": 10.0 * len(timed)}, call[0]()

    monkeypatch.setattr(bs, "measure", fake_measure)
    row = bs.shrink(next(r for r in bs.ROWS if r.name == "vit_b16"))
    res = bs.run_row(row, {"ours": kernel, "ours_b": kernel}, [], bs.Options(reps=1, device="cpu"))
    assert len(timed) == 5  # warm-up, A, B, B, A
    assert res["impls"]["ours"]["runs"] == [{"fwd_ms": 2.0, "fb_ms": 20.0}, {"fwd_ms": 5.0, "fb_ms": 50.0}]
    assert res["impls"]["ours_b"]["runs"] == [{"fwd_ms": 3.0, "fb_ms": 30.0}, {"fwd_ms": 4.0, "fb_ms": 40.0}]


def test_two_builds_are_timed_in_both_positions(bs):
    # A, B, B, A and the mean of each build's runs (no build needed: these run on every machine)
    assert bs.timing_order(["ours", "ours_b"]) == ["ours", "ours_b", "ours_b", "ours"]
    assert bs.timing_order(["ours"]) == ["ours"]
    rec = bs.merge_runs([{"setup_s": 1.0, "fwd_ms": 1.0, "fb_ms": 3.0}, {"setup_s": 0.1, "fwd_ms": 2.0, "fb_ms": 5.0}])
    assert rec["fwd_ms"] == 1.5 and rec["fb_ms"] == 4.0 and rec["setup_s"] == 1.0
    assert rec["runs"] == [{"fwd_ms": 1.0, "fb_ms": 3.0}, {"fwd_ms": 2.0, "fb_ms": 5.0}]
    assert "error" in bs.merge_runs([{"fwd_ms": 1.0}, {"error": "RuntimeError: boom"}])
    # the host's pace per call (CUDA runs) is averaged and kept per run the same way
    rec = bs.merge_runs([{"fwd_ms": 1.0, "fwd_host_ms": 0.5}, {"fwd_ms": 2.0, "fwd_host_ms": 1.5}])
    assert rec["fwd_host_ms"] == 1.0 and rec["runs"][1] == {"fwd_ms": 2.0, "fwd_host_ms": 1.5}


def test_b_force_sets_the_knob_while_b_alone_runs(bs, kernel, monkeypatch):
    """--b-force: B is the same build with WINATTN_FORCE_KERNEL set around its timings only (A, B, B, A), and the
    environment is as before afterwards."""
    import os

    if kernel.BUILD_DEVICE != "cpu":
        pytest.skip("the dry run takes the CPU build")
    monkeypatch.delenv("WINATTN_FORCE_KERNEL", raising=False)
    seen = []

    class Spy:
        def __init__(self, label):
            self.label = label

        def attention(self, *args, **kwargs):
            seen.append((self.label, os.environ.get("WINATTN_FORCE_KERNEL")))
            return kernel.attention(*args, **kwargs)

    row = bs.shrink(next(r for r in bs.ROWS if r.name == "vit_b16"))
    opt = bs.Options(reps=1, device="cpu", env={"ours_b": {"WINATTN_FORCE_KERNEL": "fwd_v3_narrow"}})
    bs.run_row(row, {"ours": Spy("a"), "ours_b": Spy("b")}, [], opt)
    assert {label for label, _ in seen} == {"a", "b"}
    assert all(knob == ("fwd_v3_narrow" if label == "b" else None) for label, knob in seen), seen
    assert "WINATTN_FORCE_KERNEL" not in os.environ


def test_two_different_builds_with_one_namespace_id_are_refused(bs, tmp_path):
    """Two builds of one id cannot be loaded side by side (the second import resolves to the first's ops): the same
    bytes are one build (the noise floor), different bytes are an error that names --unique-id."""
    def variant(name, lib):
        d = tmp_path / name
        d.mkdir()
        (d / "metadata.json").write_text('{"id": "d6ad013_dirty"}')
        (d / "_window_attention_cuda_d6ad013_dirty.abi3.so").write_bytes(lib)
        return str(d)

    a, same, other = variant("a", b"one"), variant("same", b"one"), variant("other", b"two")
    assert bs.same_build(a, a) and bs.same_build(a, same)
    with pytest.raises(SystemExit, match="--unique-id"):
        bs.same_build(a, other)
    (Path(other) / "metadata.json").write_text('{"id": "v39b"}')
    assert not bs.same_build(a, other)


def test_grad_leaves_are_qkv_and_the_learnable_term(bs):
    row = bs.shrink(next(r for r in bs.ROWS if r.name == "beit_b16_fp32"))
    x = bs.make_inputs(row, "cpu")
    learn = bs.learnable(x)
    assert bs.grad_leaves(x, learn) == [x["q"], x["k"], x["v"], learn]
    row = bs.shrink(next(r for r in bs.ROWS if r.name == "vit_l16_infer"))  # (inference: nothing to differentiate)
    x = bs.make_inputs(row, "cpu")
    assert bs.grad_leaves(x, bs.learnable(x)) == []


def test_fa4_missing_is_a_reason_not_a_crash(bs, monkeypatch):
    """Without FA4's staged wheels (this machine, or an H200 call that skipped fa4_wheels.sh) its rows say why: the
    matrix skips it with the import's reason, and bench_fwd / bench_cuda's FA4 call raises the same reason, which
    their peer rows record (one import, shared by the three benchmarks)."""
    import bench_cuda as bc

    monkeypatch.setattr(bc, "FA4_SITE", "/nonexistent/fa4/site")
    monkeypatch.setattr(bc, "_FA4", {})
    fn, why = bc.fa4_import()
    assert fn is None and "/nonexistent/fa4/site" in why and "flash_attn" in why
    assert bs.fa4_import is bc.fa4_import
    plain = next(r for r in bs.ROWS if not r.terms)
    assert bs.fa4_takes(plain) in (why, "FA4 needs CUDA")
    with pytest.raises(RuntimeError, match="FA4 not importable"):
        bc.fa4_attention(None, None, None)
