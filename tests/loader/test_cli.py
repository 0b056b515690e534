"""`winattn verify` and `winattn info` (run in-process through winattn.cli.main)."""

import json

from winattn.cli import main

from .conftest import REPO, publish_build, push, variant_files


def test_verify_local_variant(make_build, keys, capsys):
    build = make_build()
    assert main(["verify", str(build.variant_dir)]) == 0
    out = capsys.readouterr().out
    assert "PASS digest:" in out and f"ok       {build.so_name}" in out and "SKIP signature" in out
    assert "PASS abi3:" in out and "PASS python-depends" in out and "1 of 1 variant(s) verified" in out

    assert main(["verify", str(build.variant_dir), "--public-key", str(keys["good"][1]), "--require-signature"]) == 1
    assert "FAIL signature" in capsys.readouterr().out


def test_verify_local_tampered_build_dir(make_build, capsys):
    build = make_build()
    so = build.variant_dir / build.so_name
    data = bytearray(so.read_bytes())
    data[1000] ^= 1
    so.write_bytes(bytes(data))
    (build.variant_dir / "extra.txt").write_text("x")
    assert main(["verify", str(build.dir)]) == 1
    out = capsys.readouterr().out
    assert "FAIL digest: 2 violation(s)" in out
    assert f"MISMATCH {build.so_name}" in out and "EXTRA    extra.txt" in out and "ok       __init__.py" in out
    assert f"FAILED: {build.variant}" in out


def test_verify_repo_and_info(hub, hf_cache, make_build, keys, capsys):
    build = make_build()
    commit = publish_build(hub, build, signing_key=keys["good"][0])
    assert main(["verify", REPO, "--endpoint", hub.url, "--public-key", str(keys["good"][1]),
                 "--require-signature"]) == 0
    out = capsys.readouterr().out
    assert "trust: PASS trusted publisher winattn" in out and f"commit {commit[:12]}" in out
    assert "PASS signature: metadata.json signed by" in out and "PASS digest" in out

    assert main(["info", REPO, "--endpoint", hub.url]) == 0
    out = capsys.readouterr().out
    assert f"would load: {build.variant}" in out and "publisher: trusted (trusted publisher winattn)" in out


def test_info_lists_rejections(hub, hf_cache, make_build, capsys):
    build = make_build()
    cuda = "torch-stable-abi210-cu126-x86_64-linux"
    files = {k.replace(build.variant, cuda): v for k, v in variant_files(build).items()}
    files.update(variant_files(build))
    push(hub, "evil/mixed", files)
    assert main(["info", "evil/mixed", "--endpoint", hub.url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["selected"] == build.variant
    assert info["rejected"] == [{"variant": cuda, "reason": "backend (cu126) does not match selected backend (cpu)"}]
    assert info["trust"].startswith("NOT trusted")

    push(hub, "evil/mixed", {}, delete=[p for p in variant_files(build)])
    assert main(["info", "evil/mixed", "--endpoint", hub.url]) == 1
    out = capsys.readouterr().out
    assert "would load: nothing" in out and f"rejected: {cuda}: backend (cu126)" in out


def test_verify_vendored_dir(hub, hf_cache, make_build, keys, tmp_path, capsys):
    from winattn.vendor import vendor

    build = make_build()
    publish_build(hub, build, signing_key=keys["good"][0])
    out_dir = vendor(REPO, version=1, out_dir=tmp_path / "vendored", endpoint=hub.url)
    assert main(["verify", str(out_dir), "--public-key", str(keys["good"][1])]) == 0
    out = capsys.readouterr().out
    assert "PASS lock:" in out and "PASS signature" in out
    assert main(["info", str(out_dir)]) == 0
    assert f"would load: {build.variant}" in capsys.readouterr().out
