"""Issue 27: `winattn.load` never hands back a module another loader imported.

The attacker writes the HF cache. `kernels.get_kernel` (which checks no signature) imports a tampered cached build
first; later in the same process `winattn.load(require_signature=True)` finds the cached copy broken, downloads it
again (the cache heals) and verifies it. On the original loader it then returned the module already in memory,
kernels' tampered one, because the healed files on disk now matched: every check said "pass". Now only a module
winattn imported itself, from its own verified copy, is reused; anything else of that op namespace is a
`KernelConflictError`, and the tampered module is never returned as verified.
"""

from __future__ import annotations

from ._loader_support import (  # noqa: F401  (fixtures)
    REPO,
    hf_cache,
    hub,
    keys,
    make_build,
    publish_build,
    run_attack,
    write_digest,
)

PAYLOAD_MARK = b"\n# tampered in the cache\n"


def test_module_imported_by_kernels_is_never_returned(hub, hf_cache, make_build, keys, tmp_path):
    from huggingface_hub import snapshot_download

    from ._loader_support import PAYLOAD

    b = make_build()
    commit = publish_build(hub, b, signing_key=keys["good"][0])
    # The cache writer: the cached build's __init__.py runs PAYLOAD, with a digest to match (kernels is satisfied).
    snapshot = snapshot_download(REPO, repo_type="kernel", revision=commit, endpoint=hub.url, cache_dir=hf_cache,
                                 allow_patterns=[f"build/{b.variant}/*"])
    cached = f"{snapshot}/build/{b.variant}"
    with open(f"{cached}/__init__.py", "ab") as f:
        f.write(PAYLOAD)
    from pathlib import Path

    write_digest(Path(cached))

    first, second = run_attack([
        {"name": "kernels", "call": "kernels", "kwargs": {"repo_id": REPO, "version": 1}},
        {"name": "winattn", "run_attention": True,
         "kwargs": {"repo_id": REPO, "version": 1, "endpoint": hub.url, "public_keys": [str(keys["good"][1])],
                    "require_signature": True}},
    ], pwned=tmp_path / "pwned", env={"HF_ENDPOINT": hub.url})
    assert first["ok"] and first["pwned"] == "pwned\n", first.get("traceback")  # kernels ran the tampered build
    assert not second["ok"], "winattn.load returned the module kernels imported from the tampered cache"
    assert second["error_type"] == "KernelConflictError", second.get("traceback")
    assert "winattn did not import it" in second["error"] and "new process" in second["error"]
    # the cache was healed by the verification that came before the refusal
    assert PAYLOAD not in (Path(cached) / "__init__.py").read_bytes()


def test_a_second_load_reuses_only_what_winattn_imported(hub, hf_cache, make_build, keys, tmp_path):
    """The same build loaded twice in one process (two repositories, one op namespace): the second load returns the
    module winattn imported the first time."""
    b = make_build()
    publish_build(hub, b, "winattn/first", signing_key=keys["good"][0])
    publish_build(hub, make_build(), "winattn/second")
    first, second = run_attack([
        {"name": "first", "kwargs": {"repo_id": "winattn/first", "version": 1, "endpoint": hub.url}},
        {"name": "second", "run_attention": True,
         "kwargs": {"repo_id": "winattn/second", "version": 1, "endpoint": hub.url}},
    ], pwned=tmp_path / "pwned")
    assert first["ok"] and second["ok"], second.get("traceback")
    assert second["info"]["reused_from"] and second["attention_err"] < 1e-4
