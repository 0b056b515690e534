"""Publisher trust, with the policy of `kernels` 0.17 (`kernels.hf_hub._check_trust_remote_code`).

- `trust_remote_code=True`: every repository is allowed.
- a list of repository ids: those repositories are allowed, in addition to trusted publishers.
- `False` (default): the publisher (text before the first `/`) must be an organization whose Hub overview
  (`GET /api/organizations/<org>/overview`) carries `trustedKernelPublisher: true`.

kernels' own function always talks to the default endpoint and signals refusal with a plain ValueError; this one
takes the caller's `HfApi` (endpoint, token) and raises `UntrustedKernelError`. The decision is returned as data so
that it can be reported and stored in the verified-receipt of the variant (offline loads rely on it). Code decides on
the decision's `kind`; its `reason` is the text users see (and the receipt records).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from .errors import UntrustedKernelError

logger = logging.getLogger(__name__)

TrustSetting = Union[bool, Iterable[str]]

# How a caller opts in (the CLI's cli_words rewrites it for commands that only report trust).
OPT_IN_HINT = (
    "Set trust_remote_code=True or add the repository ID to the trust_remote_code allowlist to allow loading "
    "kernels from untrusted sources."
)


class TrustKind(enum.Enum):
    """What a repository is trusted by."""

    PUBLISHER = "publisher"  # the Hub marks its organization `trustedKernelPublisher`
    OPT_IN = "opt-in"  # trust_remote_code=True
    ALLOWLIST = "allowlist"  # listed in trust_remote_code
    VENDORED = "vendored"  # a vendored copy: vendoring it was the decision, its lock file pins what was decided on


_PUBLISHER_REASON = "trusted publisher "
_RECORDED = {"trust_remote_code": TrustKind.OPT_IN, "allowlist": TrustKind.ALLOWLIST, "vendored": TrustKind.VENDORED,
             "vendored (lock file)": TrustKind.VENDORED}


@dataclass(frozen=True)
class TrustDecision:
    """Why a repository was allowed.

    Attributes:
        repo_id: the repository.
        kind: what it is trusted by.
        reason: the text shown and recorded: "trust_remote_code", "allowlist", "trusted publisher <org>",
            "vendored (lock file)".
    """

    repo_id: str
    kind: TrustKind
    reason: str


def vendored_trust(repo_id: str) -> TrustDecision:
    """A vendored copy is trusted by being vendored (`winattn.load(vendored=...)` does no trust check)."""
    return TrustDecision(repo_id, TrustKind.VENDORED, "vendored (lock file)")


def recorded_kind(reason) -> Optional[TrustKind]:
    """The kind of a decision recorded as its `reason` (a verified-receipt's origin, which may have been rewritten by
    anyone who can write the cache), or None when it is no reason this module writes."""
    if isinstance(reason, str) and reason.startswith(_PUBLISHER_REASON):
        return TrustKind.PUBLISHER
    return _RECORDED.get(reason) if isinstance(reason, str) else None


def normalize(trust_remote_code: TrustSetting) -> bool | list[str]:
    """`True`/`False` stay booleans; any other iterable of strings becomes a list (the allowlist).

    Anything else (e.g. `1`, which would otherwise fail as "'int' object is not iterable", or a list holding a
    non-string) raises TypeError naming the argument.
    """
    if isinstance(trust_remote_code, bool):
        return trust_remote_code
    if trust_remote_code is None:
        return False
    if isinstance(trust_remote_code, str):
        return [trust_remote_code]
    try:
        repos = list(trust_remote_code)
    except TypeError:
        repos = None
    if repos is None or not all(isinstance(r, str) for r in repos):
        raise TypeError(
            "trust_remote_code must be a bool or a list of repository ids (str), got "
            f"{type(trust_remote_code).__name__} {trust_remote_code!r}"
        )
    return repos


def explicit_trust(repo_id: str, trust_remote_code: TrustSetting) -> TrustDecision | None:
    """The decision when the caller opted in for this repository (no network needed), else None."""
    setting = normalize(trust_remote_code)
    if setting is True:
        return TrustDecision(repo_id, TrustKind.OPT_IN, "trust_remote_code")
    if isinstance(setting, list) and repo_id in setting:
        return TrustDecision(repo_id, TrustKind.ALLOWLIST, "allowlist")
    return None


def check_trust(repo_id: str, trust_remote_code: TrustSetting, *, api) -> TrustDecision:
    """Check that `repo_id` may be loaded; raise `UntrustedKernelError` otherwise.

    Args:
        repo_id: "<org>/<name>".
        trust_remote_code: True, False or an allowlist of repository ids.
        api: the `huggingface_hub.HfApi` for the Hub the kernel comes from.
    """
    decision = explicit_trust(repo_id, trust_remote_code)
    if decision is not None:
        return decision
    publisher = repo_id.split("/", 1)[0]
    try:
        info = api.get_organization_overview(publisher)
    except Exception as e:  # user namespace, unknown org, HTTP error: trust cannot be established
        if _is_transport_error(e) or getattr(getattr(e, "response", None), "status_code", None) == 401:
            raise  # the Hub is unreachable or refuses the token: the caller reports that, not a verdict on trust
        raise UntrustedKernelError(
            f"Kernel repository '{repo_id}' could not verify publisher trust status of '{publisher}' "
            f"({type(e).__name__}: {e}). {OPT_IN_HINT}"
        ) from e
    if getattr(info, "trustedKernelPublisher", False) is True:
        return TrustDecision(repo_id, TrustKind.PUBLISHER, f"{_PUBLISHER_REASON}{publisher}")
    raise UntrustedKernelError(
        f"Kernel repository '{repo_id}' is not from a trusted publisher ('{publisher}'). {OPT_IN_HINT}"
    )


def _is_transport_error(e: BaseException) -> bool:
    """Connection-level failures (no HTTP answer at all), as opposed to an answer saying no."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(e, HfHubHTTPError):
        return False
    if isinstance(e, (OfflineModeIsEnabled, ConnectionError, TimeoutError)):
        return True
    try:
        import httpx2 as httpx
    except ImportError:  # huggingface_hub < 2
        import httpx
    return isinstance(e, httpx.TransportError)
