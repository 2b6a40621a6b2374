"""`--load-format random`: a model of a config.json's architecture with random weights, for benchmarks that need
the shape of a large model but none of its 16 GB of weights (like vLLM's `--load-format dummy`).

Each tensor is drawn when the engine asks for it, from a seed of its name, and dropped once packed: the host
never holds the whole model in float. Matrices are N(0, 0.02) (HF's initializer range), norms U(0.9, 1.1), so
activations stay finite through 32 layers; a quantized recipe quantizes them like any float checkpoint's."""
from __future__ import annotations

import sys
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from .config import ModelConfig
from .loaded import LoadedModel
from .shapes import expected_shapes

LOAD_FORMATS = ("auto", "random")


def check_load_format(load_format: str) -> None:
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load format {load_format!r}: expected one of {', '.join(LOAD_FORMATS)}")


def random_weight(name: str, shape: tuple[int, ...], device: str = "cpu", seed: int = 0):
    """f16 torch tensor `name`, a function of (name, seed) on one kind of device (CPU and CUDA generators
    differ)."""
    import torch
    g = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()) + seed * 2**32)
    if name.endswith("norm.weight"):
        return (0.9 + 0.2 * torch.rand(shape, generator=g, device=device)).half()
    return torch.randn(shape, generator=g, device=device, dtype=torch.float16).mul_(0.02)


class RandomTensors(Mapping):
    """name -> a fresh random f16 CPU tensor, drawn on `device` when asked for and never kept."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], device: str, seed: int) -> None:
        self.shapes, self.device, self.seed = shapes, device, seed

    def __getitem__(self, name: str):
        drawn = random_weight(name, self.shapes[name], self.device, self.seed)
        host = drawn.cpu()
        if drawn.is_cuda:  # give torch's cached block back: the engine sizes its KV cache from free memory
            import torch
            del drawn
            torch.cuda.empty_cache()
        return host

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


class RandomModel(LoadedModel):
    def num_parameters(self) -> int:  # from the shapes: drawing every tensor again just to count would be slow
        total = 0
        for shape in self.tensors.shapes.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


def _generator_device(device: str) -> str:
    """Draw on the GPU when the model goes there (seconds instead of minutes for 8B), else on the CPU."""
    import torch
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return str(device)
    return "cpu"


def load_random(path: str | Path, device: str = "cpu", seed: int = 0, progress: bool = True) -> LoadedModel:
    """An HF directory's config.json (its tokenizer too when it has one) with random weights."""
    from .hf_loader import _read_json, _tokenizer
    from .token_id_tokenizer import TokenIdTokenizer

    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"--load-format random needs a model directory holding config.json, got {directory}")
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory}: no config.json (--load-format random reads the architecture from it)")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ImportError("--load-format random draws its weights with torch: pip install torch") from None
    config = ModelConfig.from_hf_config(_read_json(directory / "config.json", "config"))
    if (directory / "tokenizer.json").is_file():
        tokenizer = _tokenizer(directory, config)
    else:
        tokenizer = TokenIdTokenizer(config.vocab_size, config.eos_token_ids)
    gen = _generator_device(device)
    if progress:
        print(f"lowbit: {directory.name}: random weights (drawn on {gen}), tokenizer: "
              f"{'tokenizer.json' if not isinstance(tokenizer, TokenIdTokenizer) else 'none, token ids as text'}",
              file=sys.stderr, flush=True)
    return RandomModel(config=config, tensors=RandomTensors(expected_shapes(config), gen, seed), tokenizer=tokenizer,
                       chat_template=tokenizer.chat_template, source=str(directory))
