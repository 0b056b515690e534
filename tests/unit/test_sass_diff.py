"""scripts/sass_diff.py without a toolkit: an instruction reordering is counted, a register rename barely."""

from repo_modules import load_repo_module

sd = load_repo_module("scripts/sass_diff.py")


def listing(**kernels):
    out = "\nFatbin elf code:\n"
    for name, lines in kernels.items():
        body = "\n".join(f"        /*{i * 16:04x}*/                   {line} ;  /* 0x0000 */" for i, line in
                         enumerate(lines))
        out += f"\t\tFunction : {name}\n\t.headerflags\t@\"EF_CUDA_SM90\"\n{body}\n\t\t..........\n\n"
    return out


LOOP = [f"IMAD R{i}, R{i + 1}, 0x{i:x}, RZ" for i in range(40)] + ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR20], R24",
                                                                  "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT"]


def test_a_moved_schedule_is_flagged_and_a_renamed_register_is_not(capsys):
    renamed = [line.replace("IMAD R7,", "IMAD R70,") for line in LOOP]  # one instruction differs
    reordered = LOOP[20:40] + LOOP[:20] + LOOP[40:]  # same instructions, another order: 20 out, 20 in
    base = listing(k_same=LOOP, k_renamed=LOOP, k_reordered=LOOP, k_gone=LOOP)
    new = listing(k_same=LOOP, k_renamed=renamed, k_reordered=reordered, k_new=LOOP)
    assert sd.compare(base, new) == 1
    out = capsys.readouterr().out
    assert "    0 of    43  k_same\n" in out and "    1 of    43  k_renamed\n" in out
    assert "   40 of    43  k_reordered  MOVED" in out
    assert "gone  k_gone" in out and "new  k_new" in out


def test_the_exit_status_and_the_name_filter(tmp_path):
    a, b = tmp_path / "a.sass", tmp_path / "b.sass"
    a.write_text(listing(k_one=LOOP, k_two=LOOP))
    b.write_text(listing(k_one=LOOP, k_two=LOOP[::-1]))
    assert sd.main(["--sass", str(a), str(b), "--only", "one"]) == 0
    assert sd.main(["--sass", str(a), str(b)]) == 1
    # addresses past 0xffff (kernels of over 4096 instructions) are read too
    assert len(sd.instructions(listing(k=LOOP * 100))["k"]) == 4300


def test_names_renamed_by_a_template_parameter_pair_up(tmp_path, capsys):
    a, b = tmp_path / "a.sass", tmp_path / "b.sass"
    a.write_text(listing(k_TraitsILi64ELi3EEE=LOOP))
    b.write_text(listing(k_TraitsILi64ELi3ELi64EEE=LOOP))
    assert sd.main(["--sass", str(a), str(b)]) == 0 and "gone  k_TraitsILi64ELi3EEE" in capsys.readouterr().out
    assert sd.main(["--sass", str(a), str(b), "--name-sub", "ELi64EEE", "EEE"]) == 0
    assert "    0 of    43  k_TraitsILi64ELi3EEE\n" in capsys.readouterr().out
