"""`kernels` 0.17.2 loading a pure-Python CPU variant from the embedded Hub, with the publisher trust check."""

from __future__ import annotations

import kernels
import pytest

from .conftest import TRUSTED, UNTRUSTED, upload_cpu_kernel


def test_trusted_org_loads_without_trust_remote_code(api):
    kernel_id = upload_cpu_kernel(api, f"{TRUSTED}/answer", 42)
    module = kernels.get_kernel(f"{TRUSTED}/answer", version=1)
    assert module.answer() == 42
    assert module.__name__ == kernel_id

    variants = kernels.get_kernel_variants(f"{TRUSTED}/answer", version=1)
    assert [type(v).__name__ for v in variants] == ["VariantAccepted"]
    assert "cpu" in str(variants[0].variant)
    assert kernels.has_kernel(f"{TRUSTED}/answer", version=1)


def test_untrusted_org_needs_trust_remote_code(api):
    upload_cpu_kernel(api, f"{UNTRUSTED}/answer", 7)
    with pytest.raises(ValueError, match="not from a trusted publisher"):
        kernels.get_kernel(f"{UNTRUSTED}/answer", version=1)
    assert kernels.get_kernel(f"{UNTRUSTED}/answer", version=1, trust_remote_code=True).answer() == 7
    allowlisted = kernels.get_kernel(f"{UNTRUSTED}/answer", revision="v1", trust_remote_code=[f"{UNTRUSTED}/answer"])
    assert allowlisted.answer() == 7


def test_missing_version_is_reported(api):
    upload_cpu_kernel(api, f"{TRUSTED}/versions", 1)
    with pytest.raises(ValueError, match="Version 2 not found"):
        kernels.get_kernel(f"{TRUSTED}/versions", version=2)


def test_offline_reload_from_cache_after_the_server_is_gone(api, hub, monkeypatch):
    """A fresh repo's v1 holds only the uploaded variant (no .gitattributes), so kernels' offline path, which wants
    every file of the cached commit, finds the snapshot complete (hub-protocol.md §6, pitfall 2).

    Offline `version=1` reads the cache's refs/v1, which only a download by branch name writes: `version=1` online
    downloads by commit id, so the first load here uses `revision="v1"`.
    """
    import sys

    from huggingface_hub import constants

    kernel_id = upload_cpu_kernel(api, f"{TRUSTED}/offline", 5)
    assert kernels.get_kernel(f"{TRUSTED}/offline", revision="v1").answer() == 5
    hub.stop()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delitem(sys.modules, kernel_id)
    assert kernels.get_kernel(f"{TRUSTED}/offline", version=1).answer() == 5
