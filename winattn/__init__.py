"""winattn: the thin, verifying loader of the window-attention kernel, plus its tooling and integrations.

`import winattn` pulls in only the loader; the builder, Hub server, publisher and signing live in their own
modules (`winattn.build`, `winattn.hub`, `winattn.publish`, ...) and the `tools` extra.
"""

from .errors import (
    BuildError,
    DownloadError,
    HubProtocolError,
    IncompatibleKernelError,
    KernelConflictError,
    KernelNotFoundError,
    NoVariantError,
    OfflineError,
    PublishError,
    RemoteValueError,
    StaleKernelError,
    UntrustedKernelError,
    VerificationError,
    WinattnError,
)
from .load import LoadInfo, load

__all__ = [
    "load",
    "LoadInfo",
    "BuildError",
    "DownloadError",
    "HubProtocolError",
    "IncompatibleKernelError",
    "KernelConflictError",
    "KernelNotFoundError",
    "NoVariantError",
    "OfflineError",
    "PublishError",
    "RemoteValueError",
    "StaleKernelError",
    "UntrustedKernelError",
    "VerificationError",
    "WinattnError",
]
