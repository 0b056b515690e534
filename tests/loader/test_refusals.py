"""Round trip through a real Hub server, and every refusal proven to import nothing.

The refusal cases are prepared on one server (one repo each, all in the trusted org unless the case is about trust)
and attempted in ONE fresh interpreter (conftest.run_child), which reports after each attempt which modules, ops and
shared objects of the kernel exist in it. The positive control — a successful `winattn.load` and
`kernels.get_kernel` in the same harness — shows that this evidence does light up when something is imported.
"""

import base64
import hashlib
import json

import pytest

from .conftest import (
    REPO,
    assert_nothing_imported,
    build_maker,
    isolate_cache,
    publish_build,
    push,
    run_child,
    start_hub,
)


def test_round_trip_kernels_get_kernel_and_winattn_load(hub, hf_cache, make_build, keys, monkeypatch):
    """publish (signed) -> `kernels.get_kernel(version=1)` (fresh process) and `winattn.load` both run attention."""
    import torch

    import winattn

    build = make_build()
    commit = publish_build(hub, build, signing_key=keys["good"][0])
    with monkeypatch.context() as mp:
        mp.setenv("HF_ENDPOINT", hub.url)  # kernels.get_kernel talks to HF_ENDPOINT (read at import in the child)
        result, = run_child([{"name": "kernels", "call": "kernels", "run_attention": True,
                              "kwargs": {"repo_id": REPO, "version": 1}}])
    assert result["ok"], result.get("traceback")
    assert result["attention_err"] < 1e-4
    assert f"snapshots/{commit}/build/{build.variant}" in result["module_file"]

    module = winattn.load(REPO, version=1, endpoint=hub.url, public_keys=[keys["good"][1]], require_signature=True)
    info = module.__winattn_info__
    assert (info.repo_id, info.version, info.revision, info.commit) == (REPO, 1, "v1", commit)
    assert info.variant == build.variant and info.source == "hub" and info.trust == "trusted publisher winattn"
    assert {c.name: c.status for c in info.checks} == {
        "files": "pass", "signature": "pass", "metadata": "pass", "digest": "pass", "kernels-minver": "pass",
        "arch": "skip", "python-depends": "pass", "smoke-test": "pass",
    }
    q, k, v = (torch.randn(2, 24, 4, 32) for _ in range(3))
    assert torch.allclose(module.attention(q, k, v), module.reference.attention(q, k, v), atol=1e-5)


def _b64_sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


@pytest.fixture(scope="module")
def refusal_results(built_variant, keys, tmp_path_factory):
    """Prepare one repo per refusal case, attempt all loads in one fresh interpreter; {case: result}."""
    root = tmp_path_factory.mktemp("refusals")
    with pytest.MonkeyPatch.context() as mp:
        hf_cache = isolate_cache(mp, root)
        hub = start_hub(root / "hub-root")
        try:
            yield _refusal_results(hub, hf_cache, build_maker(built_variant, root), keys)
        finally:
            hub.stop()


def _refusal_results(hub, hf_cache, make_build, keys):
    good_pub, other_priv = str(keys["good"][1]), keys["other"][0]
    signed = dict(public_keys=[good_pub], require_signature=True)
    cases = []

    def case(name, repo_id, expect, **kwargs):
        cases.append({"name": name, "expect": expect,
                      "kwargs": {"repo_id": repo_id, "endpoint": hub.url, "version": 1, **kwargs}})

    # A same-size byte swap of the .so, pushed to the branch (digest check).
    b = make_build()
    publish_build(hub, b, "winattn/tamper-so")
    so = bytearray((b.variant_dir / b.so_name).read_bytes())
    for i in range(len(so) // 2, len(so) // 2 + 16):
        so[i] ^= 0xFF
    assert len(so) == (b.variant_dir / b.so_name).stat().st_size
    push(hub, "winattn/tamper-so", {b.path_in_repo(b.so_name): bytes(so)})
    case("so-byte-swap", "winattn/tamper-so", ("VerificationError", "File hash mismatch for " + b.so_name))

    # An edited __init__.py.
    b = make_build()
    publish_build(hub, b, "winattn/tamper-init")
    init = (b.variant_dir / "__init__.py").read_bytes() + b"\nimport os  # injected\n"
    push(hub, "winattn/tamper-init", {b.path_in_repo("__init__.py"): init})
    case("edited-init", "winattn/tamper-init", ("VerificationError", "File hash mismatch for __init__.py"))

    # An extra file.
    b = make_build()
    publish_build(hub, b, "winattn/tamper-extra")
    push(hub, "winattn/tamper-extra", {b.path_in_repo("sitecustomize.py"): b"print('owned')\n"})
    case("extra-file", "winattn/tamper-extra", ("VerificationError", "Unknown file: sitecustomize.py"))

    # An edited digest in metadata.json (claims another hash for _ops.py).
    b = make_build()
    publish_build(hub, b, "winattn/tamper-digest")
    meta = json.loads((b.variant_dir / "metadata.json").read_text())
    meta["digest"]["files"]["_ops.py"] = _b64_sha256(b"something else")
    push(hub, "winattn/tamper-digest", {b.path_in_repo("metadata.json"): json.dumps(meta).encode()})
    case("edited-digest", "winattn/tamper-digest", ("VerificationError", "File hash mismatch for _ops.py"))

    # Missing signature while keys are configured and required.
    b = make_build()
    publish_build(hub, b, "winattn/unsigned")
    case("missing-signature", "winattn/unsigned", ("VerificationError", "require_signature=True"), **signed)

    # Forged signature: signed with a key that is not trusted.
    b = make_build()
    publish_build(hub, b, "winattn/forged", signing_key=other_priv)
    case("forged-signature", "winattn/forged", ("VerificationError", "unknown key"), **signed)

    # Signature valid, but metadata.json (its digest) edited afterwards to match a swapped file.
    b = make_build()
    publish_build(hub, b, "winattn/resigned-meta", signing_key=keys["good"][0])
    evil_ops = b"import torch\nops = None\n"
    meta = json.loads((b.variant_dir / "metadata.json").read_text())
    meta["digest"]["files"]["_ops.py"] = _b64_sha256(evil_ops)
    push(hub, "winattn/resigned-meta", {b.path_in_repo("_ops.py"): evil_ops,
                                        b.path_in_repo("metadata.json"): json.dumps(meta).encode()})
    case("metadata-changed-after-signing", "winattn/resigned-meta", ("VerificationError", "bad signature"), **signed)

    # The branch moved to an unsigned commit after a signed publication.
    b = make_build()
    signed_commit = publish_build(hub, b, "winattn/moved", signing_key=keys["good"][0])
    b2 = make_build()
    unsigned_commit = publish_build(hub, b2, "winattn/moved")
    assert unsigned_commit != signed_commit
    case("branch-moved-to-unsigned", "winattn/moved", ("VerificationError", "require_signature=True"), **signed)

    # An untrusted publisher without trust_remote_code.
    b = make_build()
    publish_build(hub, b, "evil/window-attention")
    case("untrusted-org", "evil/window-attention", ("UntrustedKernelError", "not from a trusted publisher"))
    case("untrusted-org-other-allowlist", "evil/window-attention",
         ("UntrustedKernelError", "not from a trusted publisher"), trust_remote_code=["winattn/something-else"])

    # Positive control, attempted LAST in the same interpreter: a good signed publication loads, and the evidence
    # that every refusal above was checked against lights up.
    b = make_build()
    control_commit = publish_build(hub, b, REPO, signing_key=keys["good"][0])
    case("control", REPO, None, **signed)
    cases[-1]["run_attention"] = True

    results = run_child([{"name": c["name"], "kwargs": c["kwargs"], "run_attention": c.get("run_attention", False)}
                         for c in cases])
    out = {}
    for c, r in zip(cases, results):
        r["expect"] = c["expect"]
        out[c["name"]] = r
    out["_context"] = {"control_commit": control_commit, "signed_commit": signed_commit,
                       "unsigned_commit": unsigned_commit, "hf_cache": hf_cache,
                       "keys": keys, "hub": hub}
    return out


REFUSALS = [
    "so-byte-swap", "edited-init", "extra-file", "edited-digest", "missing-signature", "forged-signature",
    "metadata-changed-after-signing", "branch-moved-to-unsigned", "untrusted-org", "untrusted-org-other-allowlist",
]


def test_every_refusal_imports_nothing(refusal_results):
    """Each tampered/untrusted load raises the right typed error, names repo/revision/cause, and imports nothing."""
    failures = []
    for name in REFUSALS:
        r = refusal_results[name]
        error_type, fragment = r["expect"]
        print(f"--- {name}: {r.get('error_type')}: {r.get('error')}")
        try:
            assert not r["ok"], f"{name}: loaded!"
            assert r["error_type"] == error_type, (name, r["error_type"], r["error"])
            assert "WinattnError" in r["error_mro"]
            assert fragment in r["error"], (name, r["error"])
            repo = {"untrusted-org": "evil/window-attention", "untrusted-org-other-allowlist": "evil/window-attention"}
            assert repo.get(name, "winattn/") in r["error"], (name, r["error"])
            if error_type == "VerificationError":
                assert "v1" in r["error"] and "nothing was imported" in r["error"]
                assert any(status == "fail" for *_, status in r["checks"])
            assert_nothing_imported(r)
        except AssertionError as e:
            failures.append(f"{name}: {e}")
    assert not failures, "\n".join(failures)


def test_positive_control_imports_and_shows_up_in_the_evidence(refusal_results):
    r = refusal_results["control"]
    assert r["ok"], r.get("traceback")
    assert r["info"]["commit"] == refusal_results["_context"]["control_commit"]
    assert r["attention_err"] < 1e-4
    ev = r["evidence"]
    assert ev["modules"] and ev["ops"] and ev["kernels_loaded"], ev
    # the .so, mapped from the private copy made while its HF cache blob was hashed (winattn.importer)
    assert any("/winattn-cache/imports/" in m for m in ev["mapped"]), ev["mapped"]


def test_untrusted_org_downloads_nothing(refusal_results):
    cache = refusal_results["_context"]["hf_cache"]
    assert not (cache / "kernels--evil--window-attention").exists()


def test_pinned_revision_keeps_the_signed_commit(refusal_results):
    """After the branch moved to an unsigned commit, the signed commit still loads when pinned by sha."""
    ctx = refusal_results["_context"]
    import winattn

    module = winattn.load("winattn/moved", revision=ctx["signed_commit"], endpoint=ctx["hub"].url,
                          public_keys=[ctx["keys"]["good"][1]], require_signature=True)
    info = module.__winattn_info__
    assert info.commit == ctx["signed_commit"] and info.revision == ctx["signed_commit"]
    assert {c.name: c.status for c in info.checks}["signature"] == "pass"


def test_untrusted_org_allowed_by_opt_in(hub, hf_cache, make_build):
    """trust_remote_code=True and an allowlist naming the repo both let the same untrusted repo load."""
    import winattn

    b = make_build()
    publish_build(hub, b, "evil/window-attention")
    m1 = winattn.load("evil/window-attention", endpoint=hub.url, trust_remote_code=True)
    assert m1.__winattn_info__.trust == "trust_remote_code"
    m2 = winattn.load("evil/window-attention", endpoint=hub.url, trust_remote_code=["evil/window-attention"])
    assert m2.__winattn_info__.trust == "allowlist"
