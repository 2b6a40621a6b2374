"""Reading a GGUF file's header: the one place that opens GGUF files (gguf-py's GGUFReader) and turns their
key/values into Python values. The model loader (models/gguf_loader.py) and the tokenizer (tokenizer.py) both use
it; it imports nothing from lowbit, so neither depends on the other. `gguf` is imported only when a file is read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


def open_gguf(path: str | Path):
    """A gguf.GGUFReader over `path`, after checking that it is a file that starts with the GGUF magic; a missing
    file is FileNotFoundError, anything else that is not a readable GGUF file a ValueError naming the path."""
    import gguf

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    if not path.is_file():
        raise ValueError(f"{path} is not a file (expected a .gguf file)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (first bytes {magic!r}, expected b'GGUF')")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # gguf-py surfaces truncation as reshape/index errors
        raise ValueError(f"{path}: truncated or corrupt GGUF file ({type(e).__name__}: {e})") from e


def gguf_metadata(reader) -> dict[str, Any]:
    """An open reader's key/values as Python values (strings, numbers, lists)."""
    # GGUF.* entries are header bookkeeping (version, counts), not metadata.
    return {key: fld.contents() for key, fld in reader.fields.items() if not key.startswith("GGUF.")}


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All key/values of a GGUF file as Python values (strings, numbers, lists)."""
    return gguf_metadata(open_gguf(path))
