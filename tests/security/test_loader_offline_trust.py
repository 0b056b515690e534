"""Issue 13, item 6: offline, only a "trusted publisher" verdict found by an earlier online load is reused, never an
earlier opt-in (`trust_remote_code`, an allowlist, DIFFUSERS_TRUST_REMOTE_KERNELS); DIFFUSERS_DISABLE_REMOTE_CODE=1
always wins.

The original loader recorded whatever allowed the online load in the verified-receipt and reused it offline, so a
process that had once opted in for an untrusted publisher kept loading it offline without opting in, even with
DIFFUSERS_DISABLE_REMOTE_CODE=1.
"""

from __future__ import annotations

import pytest

from ._loader_support import (  # noqa: F401  (fixtures)
    hf_cache,
    hub,
    make_build,
    no_network,
    offline,
    publish_build,
)

UNTRUSTED = "evil/window-attention"


@pytest.mark.parametrize("opt_in", [True, [UNTRUSTED]], ids=["trust_remote_code", "allowlist"])
def test_offline_does_not_reuse_an_online_opt_in(hub, hf_cache, make_build, offline, no_network, opt_in):
    import winattn
    from winattn.errors import UntrustedKernelError

    publish_build(hub, make_build(), UNTRUSTED)
    online = winattn.load(UNTRUSTED, endpoint=hub.url, trust_remote_code=opt_in)
    assert online.__winattn_info__.trust in ("trust_remote_code", "allowlist")
    hub.stop()
    offline()
    attempts = no_network()
    with pytest.raises(UntrustedKernelError, match="opt-in is not remembered"):
        winattn.load(UNTRUSTED, version=1)
    again = winattn.load(UNTRUSTED, version=1, trust_remote_code=opt_in)  # opting in again, offline, works
    assert again.__winattn_info__.source == "offline-cache"
    assert attempts == []


def test_an_opt_in_does_not_erase_a_publisher_verdict(hub, hf_cache, make_build, offline, no_network):
    """Online: trusted publisher, then the same entry with trust_remote_code=True; offline the verdict still holds."""
    import winattn

    publish_build(hub, make_build())
    winattn.load("winattn/window-attention", endpoint=hub.url)
    winattn.load("winattn/window-attention", endpoint=hub.url, trust_remote_code=True)
    hub.stop()
    offline()
    no_network()
    info = winattn.load("winattn/window-attention", version=1).__winattn_info__
    assert info.trust == "offline: trusted publisher winattn"


def test_diffusers_disable_remote_code_wins_offline_after_an_online_opt_in(hub, hf_cache, make_build, offline,
                                                                          no_network, monkeypatch):
    import winattn.integrations.diffusers as wd
    from winattn.errors import UntrustedKernelError

    publish_build(hub, make_build(), UNTRUSTED)
    name = "window_attn_sec_offline"
    wd.register(name, repo_id=UNTRUSTED, endpoint=hub.url)
    try:
        wd.unload(name)
        monkeypatch.setenv("DIFFUSERS_TRUST_REMOTE_KERNELS", "1")
        assert wd.load_backend(name).__winattn_info__.trust == "trust_remote_code"  # the online opt-in
        hub.stop()
        offline()
        no_network()
        monkeypatch.setenv("DIFFUSERS_DISABLE_REMOTE_CODE", "1")
        wd.unload(name)
        with pytest.raises(UntrustedKernelError, match="DIFFUSERS_DISABLE_REMOTE_CODE is set and overrides"):
            wd.load_backend(name)
        monkeypatch.delenv("DIFFUSERS_DISABLE_REMOTE_CODE")
        wd.unload(name)
        assert wd.load_backend(name).__winattn_info__.trust == "trust_remote_code"  # an offline opt-in, again
    finally:
        wd.unload(name)


@pytest.mark.parametrize("origin", ["trusted publisher winattn", ["x"], {"repo_id": ["x"]}])
def test_receipt_origin_of_the_wrong_shape_is_no_offline_verdict(hub, hf_cache, make_build, offline, origin):
    """Audit 3: an offline load read the receipt's `origin` with `.get`: one that is not an object raised
    AttributeError out of `winattn.load` (every offline load of the entry broke). Now it is no verdict: the offline
    load asks for an opt-in, as without a receipt."""
    import json

    import winattn
    from winattn.errors import UntrustedKernelError
    from winattn.receipts import receipt_path

    publish_build(hub, make_build())
    online = winattn.load("winattn/window-attention", endpoint=hub.url)
    path = receipt_path(online.__winattn_info__.variant_path)
    receipt = json.loads(path.read_text())
    receipt["origin"] = origin
    path.write_text(json.dumps(receipt))
    offline()
    with pytest.raises(UntrustedKernelError, match="opt-in is not remembered"):
        winattn.load("winattn/window-attention", version=1)
