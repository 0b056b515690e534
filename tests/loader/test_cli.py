"""`winattn verify` and `winattn info` (run in-process through winattn.cli.main)."""

import json

import pytest

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


def test_info_and_verify_for_a_backend_this_machine_has_not(hub, hf_cache, make_build, capsys):
    """`--backend cuda` on the CPU machine: what a CUDA machine would load, resolved without importing anything of
    CUDA (kernels' own backend check refuses a backend torch was not built for, with a traceback)."""
    from winattn.cli import main as cli

    build = make_build()
    cuda = "torch-stable-abi210-cu126-x86_64-linux"
    files = {k.replace(build.variant, cuda): v for k, v in variant_files(build).items()}
    files.update(variant_files(build))
    push(hub, "winattn/mixed", files)
    assert cli(["info", "winattn/mixed", "--endpoint", hub.url, "--backend", "cuda"]) == 0
    out = capsys.readouterr().out
    assert f"would load: {cuda}" in out and "a cuda machine: backend cu126 (asked: cuda" in out
    assert f"rejected: {build.variant}: backend (cpu) does not match selected backend (cu126)" in out
    assert cli(["info", "winattn/mixed", "--endpoint", hub.url, "--backend", "cu128", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["selected"] == cuda  # kernels' rule: same major, minor <= 8
    assert cli(["info", "winattn/mixed", "--endpoint", hub.url, "--backend", "cu130"]) == 1
    assert "CUDA version (12.6) is not compatible with system CUDA version (13.0)" in capsys.readouterr().out

    # verify: downloads and checks the variant a CUDA machine would load (nothing imported), one report, no traceback
    rc = cli(["verify", "winattn/mixed", "--endpoint", hub.url, "--backend", "cuda", "--no-files"])
    out = capsys.readouterr().out
    assert f"variant {cuda} (" in out and "1 variant(s) verified" in out and "Traceback" not in out
    assert rc == (0 if "=> OK" in out else 1)


def test_verify_a_repo_with_no_variant_for_this_machine(hub, hf_cache, make_build, capsys):
    """Only a CUDA variant on the Hub: `verify REPO` says no variant fits this machine (exit 1, no traceback; it
    raised AttributeError), and `--all-variants` still checks the one there is."""
    from winattn.cli import main as cli

    build = make_build()
    cuda = "torch-stable-abi210-cu126-x86_64-linux"
    push(hub, "winattn/cuda-only", {k.replace(build.variant, cuda): v for k, v in variant_files(build).items()})
    rc = cli(["verify", "winattn/cuda-only", "--endpoint", hub.url, "--no-files"])
    out = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out.out + out.err, out
    assert "trust: PASS" in out.out and cuda in out.out + out.err, out
    rc = cli(["verify", "winattn/cuda-only", "--endpoint", hub.url, "--no-files", "--all-variants"])
    out = capsys.readouterr().out
    assert f"variant {cuda} (" in out and "1 variant(s) verified" in out and "Traceback" not in out


def test_an_unknown_backend_is_a_usage_error(capsys):
    from winattn.cli import main as cli

    with pytest.raises(SystemExit) as e:
        cli(["info", "--backend", "cudaa"])
    assert e.value.code == 2
    assert "unknown backend 'cudaa': use cpu, cuda" in capsys.readouterr().err


def test_load_for_a_backend_this_machine_cannot_run_falls_back_only_when_asked(hub, hf_cache, make_build, caplog):
    """`winattn.load(backend="cuda")` on the CPU machine is `NoVariantError` (the one failure `fallback="reference"`
    replaces), not kernels' ValueError traceback; an unknown name is a ValueError."""
    import winattn
    from winattn.errors import KernelNotFoundError, NoVariantError

    with pytest.raises(NoVariantError, match="backend 'cuda' cannot run on this machine") as e:
        winattn.load(REPO, endpoint=hub.url, backend="cuda")
    assert isinstance(e.value, KernelNotFoundError)  # what callers caught before
    module = winattn.load(REPO, endpoint=hub.url, backend="cuda", fallback="reference")
    assert module.__winattn_info__.source == "reference"
    assert "cannot run on this machine" in caplog.text and "fallback='reference'" in caplog.text
    with pytest.raises(ValueError, match="unknown backend"):
        winattn.load(REPO, endpoint=hub.url, backend="nope")


def test_cli_messages_name_flags_not_python_arguments(hub, hf_cache, make_build, keys, offline, capsys, caplog,
                                                      tmp_path):
    """Messages shared with winattn.load read as command-line flags on the command line (no `require_signature=`,
    `trust_remote_code`, `revision=<commit>`); offline, no hint to set what is already set."""
    build = make_build()
    push(hub, "evil/mixed", variant_files(build))
    assert main(["info", "evil/mixed", "--endpoint", hub.url]) == 0
    out = capsys.readouterr().out
    assert "publisher: NOT trusted" in out and "unless the caller opts in" in out and "trust_remote_code" not in out

    assert main(["verify", str(build.variant_dir), "--require-signature"]) == 1
    out = capsys.readouterr().out
    assert "--require-signature was given but no --public-key" in out and "require_signature" not in out
    assert main(["verify", str(build.variant_dir), "--public-key", str(keys["good"][1])]) == 0
    out = capsys.readouterr().out
    assert "because --require-signature was not given" in out and "require_signature" not in out + caplog.text
    assert "pass --require-signature to refuse it" in caplog.text

    offline()
    assert main(["vendor", "--local-dir", str(tmp_path / "v"), "--endpoint", hub.url]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "offline mode (HF_HUB_OFFLINE is set); unset HF_HUB_OFFLINE" in err
    assert "set HF_HUB_OFFLINE=1" not in err
    assert main(["info", "--version", "3"]) == 1
    err = capsys.readouterr().err
    assert "pass --revision COMMIT" in err and "revision=" not in err


def test_info_reads_this_machine_without_importing_torch(hub, hf_cache, make_build):
    """`winattn info` took 6.5 s, 5 of them importing torch for what kernels reads from it (version, CUDA/ROCm/XPU
    build): now read from torch's version.py, the same values as kernels' own detection, and torch is not imported."""
    import subprocess
    import sys

    from winattn import resolve

    assert resolve._probe_without_torch() == resolve._probe_with_kernels()
    publish_build(hub, make_build())
    script = ("import sys\nfrom winattn.cli import main\nrc = main(['info', '--endpoint', sys.argv[1]])\n"
              "print('torch imported:', 'torch' in sys.modules)\nsys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", script, hub.url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "would load: torch-stable-abi210-cpu-x86_64-linux" in r.stdout and "torch imported: False" in r.stdout


def test_verify_quiet_prints_the_verdicts_only(hub, hf_cache, make_build, keys, capsys):
    build = make_build()
    publish_build(hub, build, signing_key=keys["good"][0])
    assert main(["verify", REPO, "--endpoint", hub.url, "--public-key", str(keys["good"][1]), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"  => OK: {build.variant}", "1 of 1 variant(s) verified"]
    assert main(["verify", str(build.variant_dir), "--require-signature", "-q"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("  FAIL signature:")
    assert out[1:] == [f"  => FAILED: {build.variant}", f"0 of 1 variant(s) verified; FAILED: {build.variant}"]


def test_verify_downloads_every_variant_before_the_first_report(hub, hf_cache, make_build, capsys, monkeypatch):
    """`verify REPO --all-variants`: the downloads (whose progress bars go to stderr) all come before the first report
    line, so that bars and reports do not interleave on a terminal."""
    from winattn import fetch, inspect_cmd

    build = make_build()
    cuda = "torch-stable-abi210-cu126-x86_64-linux"
    files = {k.replace(build.variant, cuda): v for k, v in variant_files(build).items()}
    push(hub, REPO, {**files, **variant_files(build)})
    events = []
    install, report = fetch.install, inspect_cmd._print_report
    monkeypatch.setattr(fetch, "install", lambda found: events.append("fetch") or install(found))
    monkeypatch.setattr(inspect_cmd, "_print_report", lambda *a, **k: events.append("report") or report(*a, **k))
    main(["verify", REPO, "--endpoint", hub.url, "--all-variants"])
    assert events == ["fetch", "fetch", "report", "report"]
    assert "of 2 variant(s) verified" in capsys.readouterr().out


def test_a_bad_or_short_revision_is_one_line_naming_what_exists(hub, hf_cache, make_build, capsys):
    """As `--version 7` does ("not found (no branch v7); available versions: v1"), not the client's 4-line
    "404 Client Error ... Revision Not Found for url ..."."""
    commit = publish_build(hub, make_build())
    capsys.readouterr()
    for revision in (commit[:7], "nosuch"):
        assert main(["info", "--revision", revision, "--endpoint", hub.url]) == 1
        err = capsys.readouterr().err.strip()
        assert err == (f"winattn info: error: revision '{revision}' of '{REPO}' not found (no branch, tag or commit of "
                       "that name; a commit is named by its full 40-hex id); branches: main, v1; tags: none")
    assert main(["info", "--version", "7", "--endpoint", hub.url]) == 1
    assert "version 7 of 'winattn/window-attention' not found (no branch v7)" in capsys.readouterr().err
