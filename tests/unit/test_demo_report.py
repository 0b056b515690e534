"""`winattn demo`'s report (`winattn.demo.report_lines`): every line labelled, the commit named once."""

import json

from winattn.demo import report_lines
from winattn.load import LoadInfo
from winattn.verify import Check

SHA = "0123456789abcdef0123456789abcdef01234567"


def _info(commit=SHA):
    return LoadInfo(repo_id="winattn/window-attention", version=1, revision="v1", commit=commit,
                    variant="torch-stable-abi210-cpu-x86_64-linux", variant_path="/x", source="hub",
                    trust="trusted publisher winattn", checks=(Check("digest", True, "9 files match", "pass"),),
                    signer="key.pub.pem")


def test_every_line_is_labelled_and_the_commit_is_not_repeated():
    rows = [("kernels.get_kernel", 1e-7), ("winattn.load", 1e-7)]
    lines = report_lines(_info(), SHA, rows, 0.5, 0.7, 1.0, 3.0, True, shape="B=2 S=256 H=4 D=64")
    body = [line for line in lines if line.startswith("  ")]
    assert all(line[2:15].strip() and line[15:16] != " " for line in body), body  # "  <label>     <value>"
    assert "\n".join(lines).count(SHA) == 0  # the demo's "published ... at commit <sha>" line names it in full
    assert f"commit {SHA[:12]}, the one just published" in lines[2]
    json_line = next(line for line in body if line.startswith("  json "))
    assert json.loads(json_line.split(None, 1)[1]) == {"errors": dict(rows), "kernel_ms": 1.0, "composite_ms": 3.0}
    assert lines[-2] == "  result       OK"


def test_a_commit_that_is_not_the_published_one_is_shown_in_full():
    other = "f" * 40
    lines = report_lines(_info(other), SHA, [], 0.5, 0.7, 1.0, 3.0, False, shape="")
    assert f"commit {other} (MISMATCH: published {SHA})" in lines[2]
