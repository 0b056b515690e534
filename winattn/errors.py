"""Every exception winattn raises. Each names the cause and the fix; catch `WinattnError` for all of them."""


class WinattnError(Exception):
    """Base class of winattn's errors.

    Attributes:
        cause: the exception behind it (e.g. the HTTP or connection error of a failed Hub call), or None. Kept here
            instead of chained, so that a traceback shows winattn's one message and not the client's 80 lines of
            chained frames; `traceback.print_exception(err.cause)` shows them.
    """

    cause: "BaseException | None" = None


class KernelNotFoundError(WinattnError, FileNotFoundError):
    """The repository, version, revision or variant does not exist (or is not visible with this token). Never
    replaced by the reference: `winattn.load(fallback="reference")` applies to `NoVariantError` only."""


class NoVariantError(KernelNotFoundError):
    """The kernel exists, but no variant of it fits this machine (backend, torch, CPU, OS), or `backend=` names one
    this machine cannot run. The message lists every variant and why it was rejected. The one failure that
    `winattn.load(fallback="reference")` replaces with the pure-PyTorch reference (with a warning saying why)."""


class UntrustedKernelError(WinattnError):
    """The publisher is not trusted and the caller did not opt in (trust_remote_code / allowlist)."""


class VerificationError(WinattnError):
    """A downloaded or vendored variant failed digest, pin, signature, arch or dependency checks.

    Attributes:
        checks: the list of (check name, passed, detail) results that led to the refusal.
    """

    def __init__(self, message: str, checks=None):
        super().__init__(message)
        self.checks = list(checks or [])


class IncompatibleKernelError(VerificationError):
    """The kernel speaks another kernel API version (`window_attention.API_VERSION`) than this winattn: the kernel is
    fetched at run time and can be older or newer than the installed winattn. Upgrade winattn, or pin the kernel
    (`version=` / `revision=`) to one of the API this winattn speaks."""


class RemoteValueError(VerificationError):
    """A word from outside this process is not what it must be, and was refused before it was used: a commit id that
    is not 40 lowercase hex digits, a ref or file name that could leave its directory, a size or a body that disagrees
    with what was declared, a redirect off the Hub, a path that resolves outside its root (`winattn.untrusted`). It
    came from a Hub's answer, a cache ref file, a verified-receipt or a vendor lock; nothing was written outside the
    cache and nothing was imported. The source is broken or hostile: check the endpoint (HF_ENDPOINT / endpoint=;
    prefer https), or remove the cache entry or directory the message names."""


class KernelConflictError(WinattnError):
    """A module with the kernel's op namespace is already in this process and winattn did not import it from its own
    verified copy (`kernels.get_kernel`, a plain import), or winattn imported another build of that namespace. Its bytes
    cannot be vouched for, and torch cannot register the namespace twice: load with winattn in a new process, before
    anything else imports the kernel."""


class StaleKernelError(WinattnError):
    """A build with this op namespace failed to load earlier in this process (its native ops may be registered and
    cannot be removed): no other build of that namespace is imported into this process; start a new one."""


class DownloadError(WinattnError, ConnectionError):
    """The Hub could not be reached, or a download failed or was interrupted. Nothing was imported; retrying resumes
    the download (complete files stay in the cache, partial ones are re-fetched)."""


class OfflineError(WinattnError):
    """Offline mode (HF_HUB_OFFLINE / vendored) and the needed files are not on disk."""


class BuildError(WinattnError):
    """`winattn build` failed: bad build.toml, compiler error or ABI violation."""


class PublishError(WinattnError):
    """`winattn publish` refused a variant or the upload failed."""


class HubProtocolError(WinattnError):
    """The embedded Hub server was asked something it cannot answer."""
