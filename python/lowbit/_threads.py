"""Names the calling thread for the OS (what `top -H`, /proc/<pid>/task/<tid>/comm and profilers show): Python
names its threads only for itself before 3.14. Linux only (prctl); elsewhere nothing happens."""
from __future__ import annotations

import ctypes
import sys

_PR_SET_NAME = 15


def name_native_thread(name: str) -> None:
    """At most 15 bytes are kept (the kernel's limit)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):  # no libc symbol: the name is only cosmetic
        pass
