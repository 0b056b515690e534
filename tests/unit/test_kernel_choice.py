"""The kernel choice (kernel-src/cuda/kernel_choice.h) is plain C++: compiled here with the host compiler, it prints the
kernel, tile, term path and dbias route it picks for a table of call shapes on an H200-like and an A100-like device
(tests/unit/kernel_choice_table.cpp). The output is compared with a golden file reviewed like code, so a change of
choice shows in the diff of the change that made it.

    python tests/unit/test_kernel_choice.py --update     # rewrite the golden file after an intended change
"""

import difflib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "tests" / "unit" / "kernel_choice_table.cpp"
GOLDEN = ROOT / "tests" / "unit" / "kernel_choice_golden.txt"


def build_table(out_dir: Path) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = out_dir / "kernel_choice_table"
    subprocess.run([cxx, "-std=c++17", "-O0", "-Wall", "-Werror", "-I", str(ROOT / "kernel-src"), str(TABLE), "-o",
                    str(exe)], check=True, capture_output=True, text=True)
    return exe


def run_table(exe: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)


def h200_choices(exe: Path) -> dict:
    """shape name -> its line in the table's first section (the H200 with sm_90a code)."""
    table = run_table(exe).stdout.split("## ")[1]
    return {line.split("|")[0].strip(): line for line in table.splitlines()[1:]}


def check_forced(exe: Path, name: str, takes=(), taken="", refuses=(), reason=""):
    """WINATTN_FORCE_KERNEL=name: each shape of `takes` prints the choice `taken`; each of `refuses` the error that
    names `reason` (a forced kernel that cannot take a call says why, it never falls back)."""
    for shape in takes:
        r = run_table(exe, "--force", name, shape)
        assert taken in r.stdout, (shape, r.stdout)
    for shape in refuses:
        r = run_table(exe, "--force", name, shape)
        assert f"this call cannot run it ({name}: {reason}" in r.stdout, (shape, r.stdout)


@pytest.fixture(scope="module")
def table_exe(tmp_path_factory):
    try:
        return build_table(tmp_path_factory.mktemp("choice"))
    except subprocess.CalledProcessError as e:
        pytest.fail(f"kernel_choice.h does not compile as plain C++:\n{e.stderr}")


def test_choice_matches_golden(table_exe):
    got = run_table(table_exe)
    assert got.returncode == 0, got.stderr
    want = GOLDEN.read_text()
    if got.stdout != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.stdout.splitlines(True), "golden", "now"))
        pytest.fail("the kernel choice changed (if intended: python tests/unit/test_kernel_choice.py --update)\n"
                    + diff)


def test_every_forced_name_parses_and_unknown_names_fail(table_exe):
    for name in ["v1", "fwd_v1", "fwd_v3", "fwd_v3_narrow", "fwd_v3_wide", "fwd_v3_short", "fwd_v3_stream",
                 "fwd_v3_two_ctas", "fwd_v3_rows192", "fwd_v3_ragged", "fwd_v3_fine_dims", "fwd_v3_persistent",
                 "fwd_v3_per_tile", "fwd_windows", "fwd_decode", "fwd_decode_tma", "bwd_v1", "bwd_v3",
                 "bwd_v3_two_stages", "bwd_v3_no_pair", "bwd_v3_fine_dims", "bwd_v3_dq_accumulate", "bwd_v3_dq_direct",
                 "bwd_v3_dq_resident", "bwd_v3_q128", "bwd_v3_q64",
                 "bwd_v3_bits",
                 "bwd_v3_fold",
                 "bwd_windows", "bwd_windows_wide",
                 "fwd_v3, bwd_v1"]:
        r = run_table(table_exe, "--force", name, "flux")  # (a kernel that cannot take Flux's call says so)
        assert r.returncode == 0 and "unknown kernel" not in r.stdout, (name, r.stdout, r.stderr)
    r = run_table(table_exe, "--force", "fwd_v9", "flux")
    assert "error: WINATTN_FORCE_KERNEL: unknown kernel 'fwd_v9'" in r.stdout
    r = run_table(table_exe, "--force", "fwd_v2", "flux")  # retired: says what runs instead
    assert "error: WINATTN_FORCE_KERNEL: fwd_v2 was retired with the v2 forward; fwd_v1 runs what it ran" in r.stdout


def test_forced_kernels_are_taken_or_refused_with_the_reason(table_exe):
    r = run_table(table_exe, "--force", "v1", "flux")
    assert "fwd_v1" in r.stdout and "bwd_v1" in r.stdout
    r = run_table(table_exe, "--force", "fwd_v3_per_tile", "flux")
    assert "per-tile" in r.stdout
    # a window kernel cannot take a long sequence: an error naming why, not another kernel
    r = run_table(table_exe, "--force", "fwd_windows", "flux")
    assert "error: WINATTN_FORCE_KERNEL=fwd_windows: this call cannot run it (head dim > 64 or window past" in r.stdout
    r = run_table(table_exe, "--force", "bwd_v3", "swin W7 table+shift")
    assert "error: WINATTN_FORCE_KERNEL=bwd_v3: this call cannot run it (the table's gradient" in r.stdout
    r = run_table(table_exe, "--force", "fwd_decode", "flux")
    assert "error: WINATTN_FORCE_KERNEL=fwd_decode: this call cannot run it (more than 16 query rows per KV head)" \
        in r.stdout
    r = run_table(table_exe, "--force", "fwd_v3_wide", "beit bias fp32")
    assert "this call cannot run it (fwd_v3_wide: wide key blocks take the no-term path at head dims" in r.stdout
    # head dim 256 has no wide tile (the 80-key one was slower, deleted): forcing it is refused, the table keeps
    # 64-key blocks
    r = run_table(table_exe, "--force", "fwd_v3_wide", "S16k D256")
    assert "this call cannot run it (fwd_v3_wide: wide key blocks take the no-term path" in r.stdout, r.stdout
    r = run_table(table_exe, "S16k D256")
    assert "fwd_v3 128x64 terms=raw persistent" in r.stdout and " wide" not in r.stdout.split("\n")[1], r.stdout


def test_direct_dq_takes_one_key_block_without_a_band(table_exe):
    """bwd_v3_dq_direct: dQ stored by the kernel where each dQ tile has one contributor, one key block and no band,
    on the kernels without a term or with a row term / mask bits (key padding included), head dims up to 128 (the
    table's choice there: RESULTS "Twenty-first session"). More key blocks, a band or the split head-dim consumer are
    refused with the reason; bwd_v3_dq_accumulate keeps the accumulator."""
    check_forced(table_exe, "bwd_v3_dq_direct",
                 takes=["sdxl cross Sk77 D64", "pixart cross Sk120 kp", "pixart cross Sk120 float mask",
                        "ltx cross Sk128 float mask", "sdxl cross Sk77 bool mask"],
                 taken=" dq-direct",
                 refuses=["vit-b S197 D64", "flux S4608 D128", "llm causal GQA", "S16k D256"],
                 reason="one key block (128 keys, head dim <= 128), no causal / window band, no term but a row "
                        "term or mask bits")
    assert " dq-direct" in run_table(table_exe, "sdxl cross Sk77 D64").stdout
    assert " dq-" not in run_table(table_exe, "--force", "bwd_v3_dq_accumulate", "sdxl cross Sk77 D64").stdout


def test_resident_dq_takes_short_calls_without_a_term(table_exe):
    """bwd_v3_dq_resident: one CTA per (batch, KV head) walks the key blocks with the group's dQ in shared memory,
    beside the deep kernel's tiles: ViT's 197 and EVA's 257 tokens (64 / 80 KB; the table's choice from 8 CTAs per
    SM); a term, the split head-dim consumer or a dQ past the shared memory is refused with the reason."""
    check_forced(table_exe, "bwd_v3_dq_resident", takes=["vit-b S197 D64", "eva02 S257 D64"],
                 taken=" dq-resident bufs=",
                 refuses=["beit bias bf16", "S16k D256", "flux S4608 D128", "vit-b/16-384 S577", "sdxl cross Sk77 D64"],
                 reason="no term, head dim <= 96, the group's dQ (heads x query rows x head dim, fp32) beside the "
                        "tiles in shared memory")
    r = run_table(table_exe, "--force", "bwd_v3_dq_resident", "vit-b S197 D64")
    assert "smem=200704" in r.stdout, r.stdout  # 135168 + 1 head x 256 rows x 64 x 4 bytes
    assert " dq-resident" in run_table(table_exe, "vit-b S197 D64").stdout
    assert " dq-" not in run_table(table_exe, "--force", "bwd_v3_dq_accumulate", "vit-b S197 D64").stdout


def test_128_query_steps_take_the_deep_kernels_calls_at_head_dim_64(table_exe):
    """bwd_v3_q128: 128 queries per backward step at head dim 64 (FA3 / FA4's 128 x 128; two stages, 196 KB), the
    deep kernel's calls (no term) whose dQ is accumulated or stored directly: the table's from 512 queries. A term,
    another head dim, a resident dQ, or deterministic accumulation is refused with the reason; bwd_v3_q64 keeps 64
    queries."""
    check_forced(table_exe, "bwd_v3_q128",
                 takes=["cogvideox S17776 D64", "sd15 D40 S4096", "vit-b/16-384 S577 D64 B64", "sdxl cross Sk77 D64"],
                 taken=" q128 bufs=1 smem=200704",  # 167936 + the third dS^T tile of 32 KB
                 refuses=["beit bias bf16", "flux S4608 D128", "vit-b S197 D64", "pixart cross Sk120 kp",
                          "S16k D256"],
                 reason="head dim <= 64, no term, dQ accumulated (not deterministic) or stored directly")
    assert " dq-direct q128" in run_table(table_exe, "sdxl cross Sk77 D64").stdout
    assert " q128" in run_table(table_exe, "cogvideox S17776 D64").stdout
    assert " q128" in run_table(table_exe, "vit-b/16-384 S577 D64 B64").stdout
    assert " q128" not in run_table(table_exe, "decode Sq2 Sk1000 GQA 8/2 D64").stdout  # (2 < 512 queries)
    assert " q128" not in run_table(table_exe, "--force", "bwd_v3_q64", "cogvideox S17776 D64").stdout


def test_streamed_tiles_take_the_no_term_path_at_three_head_dims(table_exe):
    """fwd_v3_stream: 128-key blocks for any key set, the consumers pipelined across tile boundaries (head dims 64, 96
    and 128; DiT's 72 and SD 1.5's 40 run at 96 and 64); a term or another head dim is refused with the reason."""
    check_forced(table_exe, "fwd_v3_stream",
                 takes=["dit-xl D72 S256", "sd15 D40 S4096", "flux S4608 D128", "vit-b S197 D64"],
                 taken="fwd_v3 128x128 terms=raw persistent streamed",
                 refuses=["beit bias fp32", "S16k D256", "bool mask [B,H,S,S] t5"],
                 reason="streamed tiles take the no-term path")


def test_streamed_tile_takes_129_to_512_keys_at_head_dims_65_to_128(table_exe):
    """stream_pays (v4.8): Wan 2.1's cross-attention to 512 keys and DiT-XL/2-256's 256 at 72 stream; eight key
    blocks or more, head dim 64 (the two-CTA tile), a band or key padding do not."""
    h200 = h200_choices(table_exe)
    for shape in ["wan cross Sk512 D128", "dit-xl D72 S256"]:
        assert "terms=raw persistent streamed" in h200[shape], h200[shape]
    for shape in ["sdxl self S1024 D64 B4", "flux S4608 D128", "vit-b S197 D64", "fp16 S2048 D96"]:
        assert "streamed" not in h200[shape], h200[shape]


def test_output_goes_through_tma_where_the_tile_has_room(table_exe):
    """fwd_v3_o_via_smem (v4.8): the epilogue stages O in shared memory for a TMA store on every forward v3 tile with
    room beside its stages and terms; not the 176-key wide tile or the staged tile at 128, not at 256, not on the
    16-column instances (48 / 80)."""
    h200 = h200_choices(table_exe)
    for shape in ["flux S4608 D128", "wan cross Sk512 D128", "cogvideox S17776 D64", "vit-b S197 D64",
                  "sdxl cross Sk77 D64", "beit bias bf16 [1,H,N,N] N197 grad", "dense bias bf16 [1,H,S,S] S4096 grad",
                  "bool mask [B,1,1,S] S4096", "pixart self D72 S4096"]:
        assert " o-tma" in h200[shape].split("|")[1], h200[shape]
    for shape in ["wan S32760 D128", "S16k D256", "sd15 D40 S4096", "bias bf16 [1,H,S,S] S1024 D128 kp",
                  "key bias [1,H,1,S] grad D256"]:
        assert " o-tma" not in h200[shape].split("|")[1], h200[shape]


def test_table_takes_the_two_cta_tile_for_vit_class_key_sets(table_exe):
    """Head dim 64 without a term: the two-CTA tile for 129-320 keys (ViT's 197, EVA's 257: 1.3x kernel time), and
    up to 1088 keys on calls of at least 8 tiles per SM (577-1025 keys: 4-18%; SDXL's 1024 keys in 640 tiles was
    slower on two CTAs); the short tile up to 128 keys."""
    r = run_table(table_exe)
    rows = {}
    for line in r.stdout.splitlines():  # (the H200 table comes first)
        if "|" in line:
            rows.setdefault(line.split("|")[0].strip(), line)
    assert "two-ctas" in rows["vit-b S197 D64"] and "two-ctas" in rows["eva02 S257 D64"]
    assert "two-ctas" in rows["vit-b/16-384 S577 D64 B64"] and "two-ctas" in rows["eva02-448 S1025 D64 B16"]
    assert "two-ctas" not in rows["vit-b/8 S785 D64 B2 (few tiles)"]
    assert "two-ctas" not in rows["sdxl self S1024 D64 B4"]
    # the rule's edges: 8 tiles per SM and 1088 keys take it; one batch item fewer, one key more do not
    assert "two-ctas" in rows["S700 D64 1056 tiles"] and "two-ctas" not in rows["S700 D64 1050 tiles"]
    assert "two-ctas" in rows["S1088 D64 1134 tiles"] and "two-ctas" not in rows["S1089 D64 1134 tiles"]
    assert "one-block" in rows["sdxl cross Sk77 D64"]
    assert "two-ctas" not in rows["sd15 D40 S4096"] and "two-ctas" not in rows["cogvideox S17776 D64"]


def test_two_cta_tile_takes_the_no_term_path_at_head_dims_up_to_96(table_exe):
    """fwd_v3_two_ctas: two CTAs per SM in 104 consumer registers: 64-key blocks at head dims 33-64 (the 48 and 64
    instances), 32-key blocks at 65-96 (forced only: the table keeps the narrow tile there); at head dim 64 also a
    staged 16-bit term alone (BEiT / T5-shaped bias; the table's where two_ctas_pay), its stage sized to the 64-key
    block; another term
    (a row term, padding or a mask beside the staged one) or a head dim past 96 is refused with the reason."""
    check_forced(table_exe, "fwd_v3_two_ctas",
                 takes=["vit-b S197 D64", "eva02 S257 D64", "sd15 D40 S4096", "decode Sq2 Sk1000 GQA 8/2 D64"],
                 taken="fwd_v3 128x64 terms=raw persistent two-ctas",
                 refuses=["flux S4608 D128", "pixart cross Sk120 float mask [B,1,1,S]",
                          "t5 bias fp32 [1,H,S,S] S512 grad kp", "bias bf16 [1,H,S,S] S1024 D128 kp"],
                 reason="the two-CTA tile takes the no-term path")
    check_forced(table_exe, "fwd_v3_two_ctas",
                 takes=["beit bias fp32 [1,H,N,N] N197 grad", "beit bias bf16 [1,H,N,N] N197 grad",
                        "t5 bias fp32 [1,H,S,S] S512 grad", "dense bias bf16 [1,H,S,S] S4096 grad"],
                 taken="fwd_v3 128x64 terms=staged persistent two-ctas")
    r = run_table(table_exe, "--force", "fwd_v3_two_ctas", "dit-xl D72 S256")
    assert "fwd_v3 128x32 terms=raw persistent two-ctas" in r.stdout, r.stdout
    assert "two-ctas" not in run_table(table_exe, "dit-xl D72 S256").stdout


def test_ragged_two_cta_tile_takes_the_no_term_path_at_head_dim_64(table_exe):
    """fwd_v3_ragged: the two-CTA tile with its last key block cut to the sequence end, at head dims 49-64, with no
    term or a staged 16-bit term alone (BEiT); another term, a head dim without it (33-48: the 48 instance has none;
    65-96) is refused with the reason. The table's wherever it takes the two-CTA tile on a key set that ends inside a
    block, without key padding (RESULTS "Twenty-first session")."""
    check_forced(table_exe, "fwd_v3_ragged",
                 takes=["vit-b S197 D64", "eva02 S257 D64", "vit-b/16-384 S577 D64 B64", "cogvideox S17776 D64"],
                 taken="fwd_v3 128x64 terms=raw persistent two-ctas ragged",
                 refuses=["flux S4608 D128", "sd15 D40 S4096", "dit-xl D72 S256",
                          "t5 bias fp32 [1,H,S,S] S512 grad kp"],
                 reason="the two-CTA tile with a ragged last key block takes the no-term path")
    check_forced(table_exe, "fwd_v3_ragged", takes=["beit bias fp32 [1,H,N,N] N197 grad"],
                 taken="fwd_v3 128x64 terms=staged persistent two-ctas ragged")
    for shape, ragged in [("vit-b S197 D64", True), ("beit bias bf16 [1,H,N,N] N197 grad", True),
                          ("S1088 D64 1134 tiles", False), ("key padding S577 D64 B64", False)]:
        assert ("ragged" in run_table(table_exe, shape).stdout) == ragged, shape


def test_192_row_tile_takes_the_no_term_path_at_head_dims_up_to_96(table_exe):
    """fwd_v3_rows192: three consumer warpgroups of 64 rows, 128-key blocks (FA3 / FA4's tile at head dims <= 96);
    forced, the no-term path with its bands and key padding (a per-block vote), without a band persistent at head
    dims 49-64 and one CTA per tile on the 48 and 80 instances (33-48, 65-80: RESULTS v5.9); a term or a head dim past
    96 is refused with the reason. The table's from 4096 queries and keys without a band or padding at head dims 49-64
    (measured: RESULTS v4.3); at 33-48 and 65-96 from 1024 with 8 tiles of 192 rows per SM (RESULTS "Twenty-first
    session")."""
    check_forced(table_exe, "fwd_v3_rows192",
                 takes=["cogvideox S17776 D64", "vit-b S197 D64", "sdxl cross Sk77 D64", "key padding S577 D64 B64"],
                 taken="fwd_v3 192x128 terms=raw persistent rows192")
    check_forced(table_exe, "fwd_v3_rows192", takes=["sd15 D40 S4096", "dit-xl D72 S256", "pixart self D72 S4096"],
                 taken="fwd_v3 192x128 terms=raw per-tile rows192")
    r = run_table(table_exe, "--force", "fwd_v3_rows192,fwd_v3_persistent", "pixart self D72 S4096")  # (forced wins)
    assert "fwd_v3 192x128 terms=raw persistent rows192 d80" in r.stdout, r.stdout
    check_forced(table_exe, "fwd_v3_rows192",
                 refuses=["flux S4608 D128", "beit bias fp32", "bool mask [B,1,S,S] S1024",
                          "bool mask [1,H,S,S] dit D72 S1024"],
                 reason="the 192-row tile takes the no-term path at head dims 33-64 and 65-96")
    r = run_table(table_exe, "--force", "fwd_v3_rows192,fwd_v3_per_tile", "cogvideox")
    assert "fwd_v3 192x128 terms=raw per-tile rows192" in r.stdout, r.stdout
    r = run_table(table_exe, "--force", "fwd_v3_rows192", "sd15 D40 S4096")  # (the 48 instance's own tile)
    assert "rows192 d48" in r.stdout, r.stdout
    # by default the long no-term calls take it; short, banded, padded or few-tile calls do not
    for shape, rows192 in [("cogvideox S17776 D64", True), ("vit-b S197 D64", False), ("sdxl self S1024 D64", False),
                           ("sd15 D40 S4096", False), ("key padding S577 D64", False), ("flux S4608 D128", False),
                           ("pixart self D72 S4096", True), ("dit-xl D72 S256", False), ("dit-xl D72 S1024", True),
                           ("sd15 B8 D40 S4096", True)]:
        r = run_table(table_exe, shape)
        assert ("rows192" in r.stdout) == rows192, (shape, r.stdout)
    # and one CTA per tile at the 48 and 80 instances, the persistent grid at 64 (rows192_per_tile_pays)
    h200 = h200_choices(table_exe)
    for shape, grid in [("pixart self D72 S4096", "per-tile"), ("dit-xl D72 S1024", "per-tile"),
                        ("sd15 B8 D40 S4096", "per-tile"), ("cogvideox S17776 D64", "persistent")]:
        assert f"terms=raw {grid} rows192" in h200[shape], h200[shape]


def test_decode_tma_takes_decode_calls_on_hopper_in_one_wave(table_exe):
    """fwd_decode_tma (the table's decode on Hopper since v5.4): the decode calls (<= 16 query rows per KV head), with
    the splits sized to one wave of its resident CTAs (two per SM at head dims <= 128: 264 on 132 SMs, rounded down);
    a call with more rows per KV head, or a device without sm_90a code, is refused with the reason."""
    check_forced(table_exe, "fwd_decode_tma",
                 takes=["decode Sq1 Sk8192 GQA", "decode Sq1 Sk4096 B1 MHA kp", "decode Sq2 Sk1000 GQA 8/2 D64",
                        "speculative Sq4 GQA 32/8 (16 rows)"],
                 taken=" tma",
                 refuses=["flux S4608 D128", "vit-b S197 D64", "swin W7 table+shift"],
                 reason="more than 16 query rows per KV head")
    for shape, want in [  # (CTAs: B x Hkv (b, kv head) pairs x splits)
        ("decode Sq1 Sk8192 GQA B32", "fwd_decode d128 rows=4 splits=1 chunk=8192 tma"),  # 256 pairs x 1
        ("decode Sq1 Sk8192 GQA", "fwd_decode d128 rows=4 splits=4 chunk=2048 tma"),  # B 8: 64 pairs x 4
        ("decode Sq1 Sk4096 B1 MHA kp", "fwd_decode d128 rows=1 splits=8 chunk=512 tma"),  # 32 pairs x 8
    ]:
        r = run_table(table_exe, "--force", "fwd_decode_tma", shape)
        line = next(x for x in r.stdout.splitlines() if x.startswith(shape + " |"))  # (NAME matches substrings)
        assert want in line, (shape, r.stdout)
    # the table takes it unforced on Hopper, fwd_decode.h (cp.async) elsewhere; forcing fwd_decode prints no tma
    sections = run_table(table_exe).stdout.split("## ")
    lines = [next(x for x in sec.splitlines() if x.startswith("decode Sq1 Sk8192 GQA B32 ")) for sec in sections[1:]]
    assert "fwd_decode d128 rows=4 splits=1 chunk=8192 tma" in lines[0], lines
    assert all("fwd_decode d128" in x and " tma" not in x for x in lines[1:]) and len(lines) > 1, lines
    r = run_table(table_exe, "--force", "fwd_decode", "decode Sq1 Sk8192 GQA B32")
    assert "fwd_decode d128 rows=4" in r.stdout and " tma" not in r.stdout, r.stdout
    r = run_table(table_exe, "--force-a100", "fwd_decode_tma", "decode Sq1 Sk8192 GQA B32")
    assert "this call cannot run it (fwd_decode_tma: not Hopper / no sm_90a code)" in r.stdout, r.stdout


def test_fine_head_dims_run_on_their_own_instances(table_exe):
    """Head dims 33-48 and 65-80 on forward v3's instances at 48 and 80, 65-96 on the backward's at 96 (16-column
    blocks), instead of 64 / 96 / 128, with every tile and term path they take there: the table's (RESULTS v4.3, and
    v5.7 for the forward's 80). fwd_v3_fine_dims / bwd_v3_fine_dims force them; other head dims are refused with the
    reason."""
    for shape, want in [
        ("dit-xl D72 S256", "fwd_v3 128x128 terms=raw persistent streamed d80 o-tma kv-resident | bwd_v3 d96"),
        ("sd15 D40 S4096", "fwd_v3 128x128 terms=raw persistent d48 | bwd_v3 d64"),
        ("pixart cross Sk120 kp", "fwd_v3 128x128 terms=row+padding persistent one-block d80 o-tma"),
        ("pixart cross Sk120 float mask [B,1,1,S]", "fwd_v3 128x128 terms=row persistent one-block d80 o-tma"),
        ("bool mask [1,H,S,S] dit D72 S1024", "fwd_v3 128x128 terms=mask-bits persistent d80 o-tma"),
    ]:
        r = run_table(table_exe, "--force", "fwd_v3_fine_dims", shape)
        assert want in r.stdout, (shape, r.stdout)
    check_forced(table_exe, "fwd_v3_fine_dims", refuses=["flux S4608 D128", "vit-b S197 D64", "swin W7"],
                 reason="the 48 / 80 instances take head dims 33-48 and 65-80")
    h200 = h200_choices(table_exe)
    assert "fwd_v3 128x128 terms=raw persistent d48 " in h200["sd15 D40 S4096"], h200
    assert "fwd_v3 128x128 terms=raw persistent streamed d80 " in h200["dit-xl D72 S256"], h200
    assert "fwd_v3 192x128 terms=raw per-tile rows192 d80 " in h200["pixart self D72 S4096"], h200
    # the backward's 16-column instance at 96 for 65-96, the table's (bwd_v3_fine_dims forces it)
    for shape, want in [("dit-xl D72 S256", "bwd_v3 d96 terms=none"),
                        ("bool mask [1,H,S,S] dit D72 S1024", "bwd_v3 d96 terms=bits"),
                        ("pixart cross Sk120 float mask [B,1,1,S]", "bwd_v3 d96 terms=row")]:
        r = run_table(table_exe, "--force", "bwd_v3_fine_dims", shape)
        assert want in r.stdout, (shape, r.stdout)
    check_forced(table_exe, "bwd_v3_fine_dims", refuses=["flux S4608 D128", "sd15 D40 S4096"],
                 reason="the 96 instance takes head dims 65-96")
    assert "| bwd_v3 d96 terms=none" in h200["dit-xl D72 S256"], table


def test_backward_mask_bits_take_masks_per_score_without_a_term(table_exe):
    """bwd_v3_bits: a bool mask per score without an additive term as transposed bits (no fold into a -inf term, no
    prepared copy); a mask broadcast over the queries, a bias, or head dim 256 are refused with the reason."""
    for shape in ["bool mask [B,H,S,S] t5 S512", "bool mask [B,1,S,S] docs GQA S4096",
                  "bool mask [1,H,S,S] dit D72 S1024"]:
        r = run_table(table_exe, "--force", "bwd_v3_bits", shape)
        bwd = next(line for line in r.stdout.splitlines() if "bwd_v3" in line)
        assert "terms=bits" in bwd and "defer" in bwd and "prep=" not in bwd, (shape, r.stdout)
    check_forced(table_exe, "bwd_v3_bits",
                 refuses=["bool mask [1,H,1,S] vit S197", "bool mask [B,H,S,1] + bias [1,H,S,S] grad"],
                 reason="a bool mask per score without an additive term")


def test_backward_mask_bits_by_default_and_the_fold_on_request(table_exe):
    """The table reads a bool mask per score as bits in the backward (measured: RESULTS v3.9); bwd_v3_fold forces
    v3.8's fold into a -inf term for A/B runs."""
    r = run_table(table_exe, "bool mask [B,H,S,S] t5 S512")
    assert "terms=bits" in next(line for line in r.stdout.splitlines() if "bwd_v3" in line), r.stdout
    r = run_table(table_exe, "--force", "bwd_v3_fold", "bool mask [B,H,S,S] t5 S512")
    bwd = next(line for line in r.stdout.splitlines() if "bwd_v3" in line)
    assert "terms=staged+hides" in bwd and "prep=" in bwd, r.stdout


def test_short_key_sets_take_one_key_block_by_default_up_to_128_keys(table_exe):
    """The table takes fwd_v3_short's 80- and 128-key tiles (CLIP's 77 tokens, PixArt's 120), not the 208-key one
    (ViT's 197: the two-CTA tile is faster there); fwd_v3_narrow forces the 128-key blocks back (A/B)."""
    r = run_table(table_exe, "sdxl cross Sk77 D64")
    assert "fwd_v3 128x80 terms=raw persistent one-block" in r.stdout, r.stdout
    r = run_table(table_exe, "vit-b S197 D64")
    assert "one-block" not in r.stdout, r.stdout
    for shape in ["sdxl cross Sk77 D64", "vit-b S197 D64"]:
        r = run_table(table_exe, "--force", "fwd_v3_narrow", shape)
        assert "fwd_v3 128x128 terms=raw persistent" in r.stdout, r.stdout
        assert "one-block" not in r.stdout and "two-ctas" not in r.stdout, r.stdout


def test_short_key_blocks_are_sized_to_the_key_set(table_exe):
    """fwd_v3_short: one key block of 80 keys for CLIP's 77, 128 for PixArt's 120, 208 for ViT's 197 (head dim 64;
    DiT's 72 runs at 96, which stops at 128), the 128 one for row terms and mask bits too; a key set or term it has no
    tile for is refused with the reason."""
    r = run_table(table_exe, "--force", "fwd_v3_short", "sdxl cross Sk77 D64")
    assert "fwd_v3 128x80 terms=raw persistent one-block" in r.stdout, r.stdout
    r = run_table(table_exe, "--force", "fwd_v3_short", "vit-b S197 D64")
    assert "fwd_v3 128x208 terms=raw persistent one-block" in r.stdout, r.stdout
    # key padding on 81-128 keys: bits staged by the producer warp (the default too)
    for force in (["--force", "fwd_v3_short"], []):
        r = run_table(table_exe, *force, "pixart cross Sk120 kp")
        assert "fwd_v3 128x128 terms=row+padding persistent one-block" in r.stdout, r.stdout
    # a row term and mask bits take the 128-key tile (whole 32-key words)
    r = run_table(table_exe, "--force", "fwd_v3_short", "pixart cross Sk120 float mask")
    assert "fwd_v3 128x128 terms=row persistent one-block" in r.stdout, r.stdout
    r = run_table(table_exe, "--force", "fwd_v3_short", "sdxl cross Sk77 bool mask")
    assert "fwd_v3 128x128 terms=mask-bits persistent one-block" in r.stdout, r.stdout
    check_forced(table_exe, "fwd_v3_short",
                 refuses=["dit-xl D72 S256", "sd15 D40 S4096", "beit bias fp32", "bool mask [1,H,1,S] vit S197"],
                 reason="short key blocks take no term, a row term or mask bits")


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            out = subprocess.run([str(build_table(Path(d)))], check=True, capture_output=True, text=True).stdout
        GOLDEN.write_text(out)
        print(f"wrote {GOLDEN}")
    else:
        sys.exit(pytest.main([__file__, "-q"]))
