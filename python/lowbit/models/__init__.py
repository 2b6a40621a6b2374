"""Model inputs: configs, GGUF / HF-directory loaders (float32 numpy, HF names and layouts)."""
from .config import ConfigError, ModelConfig, SUPPORTED_ARCHS
from .loaded import LoadedModel
from .registry import default_model_path, load_model_source
from .shapes import check_tensors, expected_shapes


def load_gguf(path, progress=True):
    from .gguf_loader import load_gguf as _load  # gguf is imported only when needed
    return _load(path, progress=progress)


def load_hf_dir(path, progress=True):
    from .hf_loader import load_hf_dir as _load
    return _load(path, progress=progress)


__all__ = ["ConfigError", "ModelConfig", "SUPPORTED_ARCHS", "LoadedModel", "default_model_path",
           "load_model_source", "load_gguf", "load_hf_dir", "check_tensors", "expected_shapes"]
