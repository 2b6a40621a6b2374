"""lowbit: a mixed-precision LLM inference engine (low-bit weights, activations and KV cache)."""
import os as _os

# Developers can import a build-tree extension: LOWBIT_DEV_BUILD=<cmake build dir>/python_ext.
_dev = _os.environ.get("LOWBIT_DEV_BUILD")
if _dev:
    __path__.insert(0, _dev)  # type: ignore[name-defined]

__version__ = "0.1.0"

# LOWBIT_NO_CORE=1 lets the pure-Python parts (loaders, tokenizer) import without the extension.
if not _os.environ.get("LOWBIT_NO_CORE"):
    from ._core import Tensor, from_dlpack, empty, cuda_available, cuda_device_count, allocator_stats, empty_cache  # noqa: F401
    from .generation import GenerationConfig  # noqa: F401,E402
    from .outputs import RequestOutput, Timings  # noqa: F401,E402
    from .llm import LLM  # noqa: F401,E402
    from .session import Session  # noqa: F401,E402
