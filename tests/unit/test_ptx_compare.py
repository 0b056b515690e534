"""scripts/ptx_compare.py without nvcc: how it splits PTX into kernel entries and what it counts as the same."""

from repo_modules import load_repo_module

pc = load_repo_module("scripts/ptx_compare.py")


def entry(name, body):
    return f".visible .entry {name}(\n.param .u64 p\n)\n{{\n{body}\n}}\n"


def test_label_numbers_and_a_false_defaulted_traits_argument_do_not_count():
    old = entry("k_FwdPipeTraitsSm90ILi64ELi128ELi3EEE", "$L__BB3_2:\nWAIT_7:\nld.local [__local_depot3];\nret;")
    new = (entry("k_new_FwdPipeTraitsSm90ILi64ELi80ELi2ELb1EEE", "ret;")
           + entry("k_FwdPipeTraitsSm90ILi64ELi128ELi3ELb0EEE", "$L__BB4_2:\nWAIT_9:\nld.local [__local_depot4];\nret;"))
    r = pc.compare(pc.entries(old), pc.entries(new))
    assert r["identical"] == ["k_FwdPipeTraitsSm90ILi64ELi128ELi3EEE"]
    assert r["new"] == ["k_new_FwdPipeTraitsSm90ILi64ELi80ELi2ELb1EEE"]  # (a true argument stays in the name)
    assert r["different"] == [] and r["gone"] == []


def test_a_changed_instruction_or_a_removed_entry_is_reported():
    old = entry("a", "add.s32 %r1, %r2, 1;\nret;") + entry("b", "ret;")
    new = entry("a", "add.s32 %r1, %r2, 2;\nret;")
    r = pc.compare(pc.entries(old), pc.entries(new))
    assert r["different"] == ["a"] and r["gone"] == ["b"] and r["identical"] == []
