"""scripts/sass_check.py without a toolkit: how it splits a cuobjdump listing into kernels and what it flags."""

from repo_modules import load_repo_module

sc = load_repo_module("scripts/sass_check.py")


def function(name, lines):
    body = "\n".join(f"        /*{i * 16:04x}*/                   {line} ;" for i, line in enumerate(lines))
    return f"\t\tFunction : {name}\n\t.headerflags\t@\"EF_CUDA_SM90\"\n{body}\n\t\t..........\n\n"


CHAINED = ["WARPGROUP.ARRIVE"] + ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR20], R24"] * 7 + [
    "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR20], R24, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT"]
SERIALIZED = []
for _ in range(8):
    SERIALIZED += ["WARPGROUP.ARRIVE", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR20], R24, gsb0",
                   "WARPGROUP.DEPBAR.LE gsb0, 0x0"]
SERIALIZED += ["STL [R1], R25", "STL.64 [R1+0x8], R94", "LDL.LU.64 R92, [R1]", "EXIT"]


def test_a_chain_with_one_wait_passes_and_a_wait_per_wgmma_is_flagged():
    listing = "\nFatbin elf code:\n" + function("k_chained_bfloat16", CHAINED) + function("k_spills_bfloat16", SERIALIZED)
    found = sc.kernels(listing)
    assert [(k.name, k.wgmma, k.waits, k.spill_stores) for k in found] == [
        ("k_chained_bfloat16", 8, 1, 0), ("k_spills_bfloat16", 8, 8, 2)]
    assert [k.serialized for k in found] == [False, True]


def test_a_few_wgmma_with_their_waits_are_not_flagged_and_the_exit_status_counts_serialized_kernels(tmp_path,
                                                                                                   capsys):
    short = ["WARPGROUP.ARRIVE", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT, gsb0",
             "WARPGROUP.DEPBAR.LE gsb0, 0x0"] * 2  # (a window kernel's one-block GEMMs)
    dump = tmp_path / "dump.sass"
    dump.write_text(function("k_short_bfloat16", short) + function("k_chained_half", CHAINED))
    assert sc.main(["--sass", str(dump)]) == 0
    dump.write_text(function("k_spills_half", SERIALIZED))
    assert sc.main(["--sass", str(dump)]) == 0  # (fp16 twins are skipped unless asked for)
    assert sc.main(["--sass", str(dump), "--all-dtypes"]) == 1
    assert "1 serialized kernel(s)" in capsys.readouterr().out


def test_the_step_loop_is_the_innermost_loop_with_a_wgmma_and_its_spills_and_uniform_instructions_are_counted():
    # an outer loop (tiles) around an inner one (steps); a one-lane loop (BRA.U.ANY) and a loop without a wgmma are
    # not steps
    lines = ["MOV R1, c[0x0][0x28]",                                   # 0x00: tile loop starts here
             "UIADD3 UR4, UR4, 0x1, URZ",                              # 0x10: step loop starts here
             "LDL R8, [R1+0x10]",
             "WARPGROUP.ARRIVE",
             "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR20], R24, gsb0",
             "@P0 UIADD3 UR5, UR5, 0x2, URZ",
             "STL [R1+0x4], R9",
             "WARPGROUP.DEPBAR.LE gsb0, 0x0",
             "@P1 BRA 0x10",                                           # 0x80: the step loop's branch back
             "R2UR UR6, R2",
             "@P0 BRA.U.ANY 0x90",                                     # 0xa0: a one-lane loop
             "LDL R3, [R1]",
             "@P2 BRA 0xb0",                                           # 0xc0: a loop with no wgmma
             "@P3 BRA 0x0",                                            # 0xd0: the tile loop's branch back
             "EXIT"]
    [k] = sc.kernels(function("k_walk_bfloat16", lines))
    assert k.step_loop == sc.StepLoop(length=8, spill_stores=1, spill_loads=1, uniform=2)
    assert sc.kernels(function("k_straight_bfloat16", CHAINED))[0].step_loop is None
