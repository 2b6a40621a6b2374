"""ModelConfig: the architecture facts the engine needs, in one validated, arch-neutral record.

Both loaders (GGUF and HF directories) produce this; the C++ side receives `to_dict()`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")
ROPE_SCALING_TYPES = ("linear", "llama3")
ROPE_PAIRINGS = ("neox", "interleaved")

# Required keys per rope-scaling type (besides "type").
_ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


class ConfigError(ValueError):
    """A model configuration that is inconsistent or asks for something lowbit does not support."""


@dataclass
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # "neox": rotate_half pairs (i, i + head_dim/2), the layout of HF Llama/Qwen2 weights.
    rope_pairing: str = "neox"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ConfigError(f"unsupported architecture {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope_theta <= 0:
            raise ConfigError(f"rope_theta must be positive, got {self.rope_theta}")
        if self.rms_norm_eps <= 0:
            raise ConfigError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        if self.rope_pairing not in ROPE_PAIRINGS:
            raise ConfigError(f"rope_pairing must be one of {ROPE_PAIRINGS}, got {self.rope_pairing!r}")
        if self.bos_token_id is not None and not 0 <= self.bos_token_id < self.vocab_size:
            raise ConfigError(f"bos_token_id {self.bos_token_id} is outside the vocabulary (size {self.vocab_size})")
        self.eos_token_ids = [int(t) for t in self.eos_token_ids]
        for t in self.eos_token_ids:
            if not 0 <= t < self.vocab_size:
                raise ConfigError(f"eos token id {t} is outside the vocabulary (size {self.vocab_size})")
        _validate_rope_scaling(self.rope_scaling)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig keys: {', '.join(unknown)}")
        return cls(**d)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from an HF `config.json` dict (Llama, Mistral, Qwen2 families)."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_ARCHS:
            raise ConfigError(
                f"unsupported model_type {model_type!r} in config.json; supported: {', '.join(SUPPORTED_ARCHS)}")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if hf.get(key) is None:
                raise ConfigError(f"config.json is missing required key {key!r}")
        if hf.get("mlp_bias"):
            raise ConfigError("mlp_bias=true is not supported (no Llama-family model lowbit runs uses it)")
        hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = hf.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise ConfigError(
                    f"config.json has no head_dim and hidden_size ({hidden}) is not divisible by "
                    f"num_attention_heads ({heads}); set head_dim explicitly")
            head_dim = hidden // heads
        # transformers v5 moved rope_theta/rope_scaling into rope_parameters; accept both spellings.
        rope_params = hf.get("rope_parameters") or {}
        rope_theta = hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling") or (rope_params if rope_params.get("rope_type", "default") != "default" else None)
        eos = hf.get("eos_token_id")
        return cls(
            arch=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hidden,
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rope_theta=float(rope_theta),
            rope_scaling=normalize_rope_scaling(scaling),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama/Mistral only when attention_bias says so.
            attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The inverse of from_hf_config (used to write HF-style directories, e.g. test fixtures)."""
        eos = self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else (self.eos_token_ids or None)
        out = {
            "model_type": self.arch,
            "architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                               "qwen2": "Qwen2ForCausalLM"}[self.arch]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "hidden_act": "silu",
        }
        if self.arch != "qwen2":
            out["attention_bias"] = self.attention_bias
        if self.rope_scaling:
            rs = dict(self.rope_scaling)
            rs["rope_type"] = rs.pop("type")
            out["rope_scaling"] = rs
        return out


def normalize_rope_scaling(scaling: dict | None) -> dict | None:
    """HF spells the type "rope_type" (new) or "type" (old); lowbit uses "type". "default" means none."""
    if not scaling:
        return None
    scaling = dict(scaling)
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None)
    scaling.pop("type", None)
    scaling.pop("rope_theta", None)  # v5 rope_parameters carries theta too; ModelConfig keeps it apart
    if kind in (None, "default"):
        return None
    if kind not in _ROPE_SCALING_KEYS:
        raise ConfigError(f"unsupported rope scaling type {kind!r}; supported: {', '.join(ROPE_SCALING_TYPES)}")
    out = {"type": kind}
    for key in _ROPE_SCALING_KEYS[kind]:
        if key not in scaling:
            raise ConfigError(f"rope scaling {kind!r} is missing {key!r}")
        out[key] = scaling[key]
    return out


def _validate_rope_scaling(scaling: dict | None) -> None:
    if scaling is None:
        return
    if not isinstance(scaling, dict) or scaling.get("type") not in _ROPE_SCALING_KEYS:
        raise ConfigError(f"rope_scaling must be None or a dict with type in {ROPE_SCALING_TYPES}, got {scaling!r}")
    missing = [k for k in _ROPE_SCALING_KEYS[scaling["type"]] if k not in scaling]
    if missing:
        raise ConfigError(f"rope_scaling {scaling['type']!r} is missing {', '.join(missing)}")
    if scaling["factor"] <= 0:
        raise ConfigError(f"rope_scaling factor must be positive, got {scaling['factor']}")
