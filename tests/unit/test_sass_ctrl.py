"""scripts/sass_ctrl.py without a toolkit: the control fields it decodes from a cuobjdump listing's second words."""

from repo_modules import load_repo_module

sc = load_repo_module("scripts/sass_ctrl.py")


def control(stall=1, yield_=0, write_sb=7, read_sb=7, wait=0, low=0x000FE2):
    return (wait << 52) | (read_sb << 49) | (write_sb << 46) | (yield_ << 45) | (stall << 41) | low


def listing(name, instrs):
    """cuobjdump's two lines per instruction: address, text and first word; then the second word alone."""
    lines = [f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_SM90"']
    for addr, text, second in instrs:
        lines.append(f"        /*{addr:04x}*/                   {text} ;                 /* 0x000000ff00057802 */")
        lines.append(f"                                                                  /* 0x{second:016x} */")
    return "\n".join(lines) + "\n\t\t..........\n"


BODY = [
    (0x00, "REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU desc[UR30][R6.64], R152", control(stall=4, read_sb=0)),
    (0x10, "LDS.64 R14, [R12+UR39+0x30000]", control(write_sb=1, read_sb=0)),
    (0x20, "IMAD.U32 R7, RZ, RZ, UR22", control(stall=2, wait=0b000011)),
    (0x30, "BRA 0x0", control(stall=5, yield_=1)),
]


def test_the_fields_of_each_instruction_are_decoded():
    dump = "\nFatbin elf code:\n" + listing("_Z5otherv", BODY[:1]) + listing("_Z3bwdv", BODY)
    name, instrs = sc.kernel(dump, "bwd")
    assert name == "_Z3bwdv"
    assert [(i.addr, i.stall, i.write_sb, i.read_sb, i.waits_on, i.yield_) for i in instrs] == [
        (0x00, 4, 7, 0, [], False), (0x10, 1, 1, 0, [], False), (0x20, 2, 7, 7, [0, 1], False),
        (0x30, 5, 7, 7, [], True)]
    assert instrs[2].text == "IMAD.U32 R7, RZ, RZ, UR22"
    assert instrs[2].line().split()[:2] == ["00020", "wait:01"]


def test_sets_lists_the_instructions_that_release_a_scoreboard(tmp_path, capsys):
    dump = tmp_path / "dump.sass"
    dump.write_text(listing("_Z3bwdv", BODY))
    assert sc.main([str(dump), "bwd", "--sets", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "_Z3bwdv"
    assert [line.split()[0] for line in out[1:]] == ["00000", "00010"]  # the add (read) and the load (read)
