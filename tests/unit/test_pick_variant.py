"""scripts/pick_variant.py: which variant of a gpu_variants.sh call lands, decided from its logs on the device."""

import pytest

from repo_modules import load_repo_module


def rounds(times: dict[str, dict[str, float]]) -> str:
    """kernel_time.py's rows for one round per variant: {variant: {"row pass": ms}}."""
    out = []
    for variant, rows in times.items():
        out.append(f"#### {variant} (round 1)")
        for key, ms in rows.items():
            row, pass_ = key.split()
            out.append(f"{row:26s} ours       {pass_:4s}      {ms:.3f}    0.050  some_kernel {ms:.3f}")
    return "\n".join(out) + "\n"


PASSED = "1203 passed, 16 skipped, 18 warnings in 29.35s\n"
CLEAN = "========= ERROR SUMMARY: 0 errors\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"


@pytest.fixture(scope="module")
def pv():
    return load_repo_module("scripts/pick_variant.py")


def write(tmp_path, times, logs):
    (tmp_path / "kernel_time.txt").write_text(rounds(times))
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
    return tmp_path


BASE = {"dit f+b": 0.451, "flux f+b": 1.628, "small fwd": 0.010}


def test_the_first_candidate_wins_unless_a_later_one_is_clearly_faster(pv, tmp_path):
    out = write(tmp_path, {"base": BASE, "a": {**BASE, "dit f+b": 0.432}, "b": {**BASE, "dit f+b": 0.431}},
                {"a_suite.log": PASSED, "b_suite.log": PASSED})
    assert pv.pick(out, "dit", ["a", "b"])[0] == "a"  # (0.2% faster: within _BETTER)
    (out / "kernel_time.txt").write_text(rounds({"base": BASE, "a": {**BASE, "dit f+b": 0.432},
                                                 "b": {**BASE, "dit f+b": 0.420}}))
    assert pv.pick(out, "dit", ["a", "b"])[0] == "b"


def test_a_slower_row_a_failed_suite_or_a_sanitizer_report_disqualifies(pv, tmp_path):
    fast = {**BASE, "dit f+b": 0.420}
    out = write(tmp_path, {"base": BASE, "a": {**fast, "flux f+b": 1.666}, "b": fast, "c": fast},
                {"a_suite.log": PASSED, "b_suite.log": "2 failed, 1201 passed in 30s\n", "c_suite.log": PASSED,
                 "c_sanitize.log": "========= ERROR SUMMARY: 3 errors\n"})
    assert pv.pick(out, "dit", ["a", "b", "c"]) == ("base", "no candidate qualified")


def test_one_quantum_on_a_tiny_row_is_not_slower(pv, tmp_path):
    out = write(tmp_path, {"base": BASE, "a": {**BASE, "dit f+b": 0.430, "small fwd": 0.011}},
                {"a_suite.log": PASSED, "a_sanitize.log": CLEAN})
    assert pv.pick(out, "dit", ["a"])[0] == "a"


def test_main_prints_the_name(pv, tmp_path, capsys):
    out = write(tmp_path, {"base": BASE, "a": {**BASE, "dit f+b": 0.430}}, {"a_suite.log": PASSED})
    assert pv.main([str(out), "dit", "a"]) == 0
    assert capsys.readouterr().out == "a\n"
    assert pv.main([str(out)]) == 2
