"""Hub-call failures, mapped once: which exceptions a Hub call raises, one line describing one, and the mapping of a
failure to winattn's typed errors. The loader, the vendor and the publisher share it (none imports another for it).
"""

from __future__ import annotations

import contextlib

from .errors import DownloadError, KernelNotFoundError, OfflineError, WinattnError


def _httpx():
    try:
        import httpx2 as httpx  # huggingface_hub 2.x
    except ImportError:  # huggingface_hub 1.x
        import httpx
    return httpx


def hub_call_errors() -> tuple:
    """Exceptions a Hub call raises for HTTP errors and unreachable servers."""
    from huggingface_hub.errors import HfHubHTTPError

    return (HfHubHTTPError, _httpx().HTTPError)


def describe_hub_error(e: Exception) -> str:
    """One line: HTTP status and the server's message, or the connection problem, plus a hint for auth errors. The
    hints name environment variables only (HF_ENDPOINT, HF_TOKEN): the line is shown to command-line users and to
    Python callers alike."""
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None) if response is not None else None
    if status is None:
        return (f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no response'}; is a Hub running "
                f"there? Start one with `winattn hub serve`, or set HF_ENDPOINT to one")
    detail = getattr(e, "server_message", None) or str(e).splitlines()[0]
    hint = " (set HF_TOKEN to a token this Hub accepts; publishing needs write access)" if status in (401, 403) else ""
    return f"HTTP {status}: {' '.join(detail.split())}{hint}"


def _offline_error(e: BaseException) -> bool:
    from huggingface_hub.errors import OfflineModeIsEnabled

    return isinstance(e, OfflineModeIsEnabled)


def _with_cause(error: WinattnError, cause: BaseException) -> WinattnError:
    """`error` with `cause` kept as its attribute; raised `from None` (not chained): a short traceback."""
    error.cause = cause
    return error


@contextlib.contextmanager
def network_step(what: str, *, repo_id: str = "", endpoint: str = ""):
    """Run one step of a load/vendor that talks to the Hub, and map its failure to a typed error naming `what`:

    - repository not found -> `KernelNotFoundError("kernel repo <id> not found at <endpoint> ...")`;
    - revision not found -> `KernelNotFoundError`;
    - offline mode (HF_HUB_OFFLINE) -> `OfflineError`;
    - any other HTTP or transport failure (and OSError) -> `DownloadError` ("nothing was imported; retry").

    The client's exception is kept as the error's `cause` attribute, not chained. winattn's own errors pass through
    unchanged.
    """
    try:
        yield
    except WinattnError:
        raise
    except (OSError, *hub_call_errors()) as e:
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        where = f" (Hub at {endpoint})" if endpoint else ""
        if isinstance(e, RepositoryNotFoundError):
            at = f" at {endpoint}" if endpoint else ""
            error = KernelNotFoundError(f"kernel repo {repo_id or '?'} not found{at} (or not accessible with this "
                                        f"token), while {what}")
        elif isinstance(e, RevisionNotFoundError):
            detail = getattr(e, "server_message", None) or str(e).splitlines()[-1]
            error = KernelNotFoundError(f"{what}{where}: revision not found ({' '.join(detail.split())})")
        elif _offline_error(e):
            error = OfflineError(f"{what}{where}: not possible in offline mode (HF_HUB_OFFLINE is set); unset "
                                 "HF_HUB_OFFLINE to reach the Hub")
        elif getattr(getattr(e, "response", None), "status_code", None) in (401, 403):  # retrying will not help
            error = DownloadError(f"{what}{where} failed: {describe_hub_error(e)}. Nothing was imported.")
        else:
            detail = describe_hub_error(e) if isinstance(e, hub_call_errors()) else f"{type(e).__name__}: {e}"
            error = DownloadError(f"{what}{where} failed: {detail}. Nothing was imported; retry, or set "
                                  "HF_HUB_OFFLINE=1 to load a copy verified earlier from the cache.")
        raise _with_cause(error, e) from None
