"""A compact float Llama forward in torch (CPU) used for calibration and fake-quant evaluation.

It reads the HF-named float32 tensors of a `LoadedModel` and computes exactly what HF `LlamaForCausalLM`
computes: RMSNorm, rotate_half ("neox") RoPE, grouped-query attention with a causal mask, SwiGLU MLP.
Quantization is simulated on top of it:
  * weights: the algorithms replace `weights[name]` by the dequantized values of the stored format;
  * activations: `act_quant` = None | "int8" (per-token symmetric, activation.h) | "fp8" (per-token e4m3) |
    "fmpq" (COMET §3, per-token per-128-channel-block int4/int8 by a per-linear block map, after the linear's
    input permutation) | "fmpq_pow2" (the same block map, block scales power-of-two multiples of one per-token scale);
  * KV cache: a `KVQuantizer` (kv_quant.py) applied to post-RoPE K and to V.
`capture` hooks hand the inputs of every linear (and the post-RoPE keys) of one layer to the calibration code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .activation_quant import (fake_quant_fmpq, fake_quant_fmpq_pow2, fake_quant_per_token_e4m3,
                               fake_quant_per_token_int8)

ATTN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


def linear_name(layer: int, short: str) -> str:
    """HF tensor name of one linear weight of a layer (`q_proj` -> model.layers.{i}.self_attn.q_proj.weight)."""
    block = "self_attn" if short in ATTN_LINEARS else "mlp"
    return f"model.layers.{layer}.{block}.{short}.weight"


def linear_names(num_layers: int) -> list[str]:
    return [linear_name(i, s) for i in range(num_layers) for s in ATTN_LINEARS + MLP_LINEARS]


@dataclass
class FakeQuant:
    """What the forward simulates besides the (already fake-quantized) weights."""
    act_quant: str | None = None                       # None | "int8" | "fp8" | "fmpq" | "fmpq_pow2"
    fmpq_block_bits: dict[str, np.ndarray] = field(default_factory=dict)  # weight name -> u8 [k/128]
    input_perm: dict[str, np.ndarray] = field(default_factory=dict)       # weight name -> int64 [k]
    # weight name -> orthogonal [k, k]: the input is rotated (x·R) before activation quantization (an online
    # rotation, QuaRot style; the weight holds W·R). Calibration studies only: the engine has no runtime rotation.
    input_rotation: dict[str, torch.Tensor] = field(default_factory=dict)
    kv: object | None = None                                     # a KVQuantizer or None


class TorchLlama:
    """Functional Llama over a dict of torch tensors (HF names). Not an nn.Module: weights are swapped freely."""

    def __init__(self, config, tensors: dict[str, np.ndarray | torch.Tensor], fake: FakeQuant | None = None):
        self.config = config
        if config.arch not in ("llama", "mistral"):
            raise ValueError(f"lowbit.quantize: architecture {config.arch!r} is not supported by the calibration "
                             "model (supported: llama, mistral)")
        if config.rope_scaling is not None:
            raise ValueError(f"lowbit.quantize: rope_scaling {config.rope_scaling['type']!r} is not supported by the "
                             "calibration model")
        if config.rope_pairing != "neox":
            raise ValueError("lowbit.quantize: only neox (rotate_half) RoPE pairing is supported")
        self.weights = {k: torch.tensor(np.asarray(v, dtype=np.float32)) if not isinstance(v, torch.Tensor)
                        else v.float() for k, v in tensors.items()}
        self.fake = fake or FakeQuant()
        self._rope_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    # ---- pieces -------------------------------------------------------------------------------------
    def lm_head_weight(self) -> torch.Tensor:
        w = self.weights.get("lm_head.weight")
        return self.weights["model.embed_tokens.weight"] if w is None else w

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.config.rms_norm_eps) * weight

    def rope(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        if t not in self._rope_cache:
            d = self.config.head_dim
            inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
            ang = torch.cat([ang, ang], dim=-1)
            self._rope_cache[t] = (ang.cos().float(), ang.sin().float())
        return self._rope_cache[t]

    @staticmethod
    def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        perm = self.fake.input_perm.get(name)
        if perm is not None:
            x = x[..., torch.as_tensor(perm)]
        rot = self.fake.input_rotation.get(name)
        if rot is not None:
            x = x @ rot
        if self.fake.act_quant == "int8":
            x = fake_quant_per_token_int8(x)
        elif self.fake.act_quant == "fp8":
            x = fake_quant_per_token_e4m3(x)
        elif self.fake.act_quant == "fmpq":
            x = fake_quant_fmpq(x, self.fake.fmpq_block_bits[name])
        elif self.fake.act_quant == "fmpq_pow2":
            x = fake_quant_fmpq_pow2(x, self.fake.fmpq_block_bits[name])
        y = x @ self.weights[name].T
        bias = self.weights.get(name[: -len("weight")] + "bias")
        return y if bias is None else y + bias

    # ---- one decoder layer ----------------------------------------------------------------------------
    def layer(self, i: int, h: torch.Tensor, capture: dict | None = None) -> torch.Tensor:
        """h: [B, T, hidden] -> [B, T, hidden]. `capture` (a dict) receives the inputs of each linear by short
        name (`q_proj` for q/k/v, `o_proj`, `gate_proj` for gate/up, `down_proj`) and post-RoPE `keys`/`values`."""
        c = self.config
        p = f"model.layers.{i}."
        b, t, _ = h.shape
        x = self.rms_norm(h, self.weights[p + "input_layernorm.weight"])
        q = self.linear(x, linear_name(i, "q_proj")).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.linear(x, linear_name(i, "k_proj")).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.linear(x, linear_name(i, "v_proj")).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self.rope(t)
        q, k = self.apply_rope(q, cos, sin), self.apply_rope(k, cos, sin)
        if capture is not None:
            capture["q_proj"], capture["keys"], capture["values"] = x, k, v
        if self.fake.kv is not None:
            k, v = self.fake.kv(i, k, v)
        rep = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        attn = attn.transpose(1, 2).reshape(b, t, c.num_heads * c.head_dim)
        if capture is not None:
            capture["o_proj"] = attn
        h = h + self.linear(attn, linear_name(i, "o_proj"))
        x = self.rms_norm(h, self.weights[p + "post_attention_layernorm.weight"])
        if capture is not None:
            capture["gate_proj"] = x
        g = self.linear(x, linear_name(i, "gate_proj"))
        u = self.linear(x, linear_name(i, "up_proj"))
        m = torch.nn.functional.silu(g) * u
        if capture is not None:
            capture["down_proj"] = m
        return h + self.linear(m, linear_name(i, "down_proj"))

    # ---- whole model ----------------------------------------------------------------------------------
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.weights["model.embed_tokens.weight"][tokens]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        # lm_head takes float activations under every recipe, as in the engine, which stores it in f16 under
        # activation-quantized recipes.
        x = self.rms_norm(h, self.weights["model.norm.weight"])
        w = self.lm_head_weight()
        if self.fake.act_quant is not None:
            w = w.to(torch.float16).to(w.dtype)
        return x @ w.T

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: int64 [B, T] -> f32 logits [B, T, vocab]."""
        h = self.embed(tokens)
        for i in range(self.config.num_layers):
            h = self.layer(i, h)
        return self.head(h)

    @torch.no_grad()
    def nll(self, tokens: torch.Tensor) -> tuple[float, int]:
        """Summed next-token negative log-likelihood over [B, T] and the number of predicted tokens."""
        logits = self.logits(tokens)[:, :-1]
        lp = torch.log_softmax(logits.double(), dim=-1)
        tgt = tokens[:, 1:]
        return float(-lp.gather(-1, tgt[..., None]).sum()), int(tgt.numel())


@torch.no_grad()
def perplexity(model: TorchLlama, token_ids: list[int], window: int = 1024) -> float:
    """Perplexity over non-overlapping windows (each window scored from its own start)."""
    total, count = 0.0, 0
    for s in range(0, len(token_ids) - 1, window):
        chunk = token_ids[s:s + window]
        if len(chunk) < 2:
            break
        n, c = model.nll(torch.tensor([chunk], dtype=torch.int64))
        total, count = total + n, count + c
    return math.exp(total / count)
