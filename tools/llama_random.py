"""A random-weight Llama shared by the end-to-end benchmarks: its shape, its weights (each tensor drawn from a
seed derived from its name, so every process and every engine sees the same f16 values without a host copy),
and round-to-nearest quantizers that follow docs/formats.md but run on the GPU (the host quantizer takes ~1 s
per 8B layer; these take milliseconds)."""
import dataclasses

import torch

from lowbit.models.random_weights import random_weight


@dataclasses.dataclass
class LlamaShape:
    vocab: int = 128256
    hidden: int = 4096
    inter: int = 14336
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 500000.0
    eps: float = 1e-5
    max_positions: int = 8192

    @property
    def q_size(self):
        return self.heads * self.head_dim

    @property
    def kv_size(self):
        return self.kv_heads * self.head_dim


LLAMA3_8B = LlamaShape()
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def linear_shape(s, suffix):
    return {"self_attn.q_proj": (s.q_size, s.hidden), "self_attn.k_proj": (s.kv_size, s.hidden),
            "self_attn.v_proj": (s.kv_size, s.hidden), "self_attn.o_proj": (s.hidden, s.q_size),
            "mlp.gate_proj": (s.inter, s.hidden), "mlp.up_proj": (s.inter, s.hidden),
            "mlp.down_proj": (s.hidden, s.inter)}[suffix]


def weight_names(s):
    """(HF name, shape, is_linear) of every tensor, untied lm_head included."""
    out = [("model.embed_tokens.weight", (s.vocab, s.hidden), False)]
    for i in range(s.layers):
        p = f"model.layers.{i}."
        out += [(p + n + ".weight", linear_shape(s, n), True) for n in LINEARS]
        out += [(p + n + ".weight", (s.hidden,), False) for n in ("input_layernorm", "post_attention_layernorm")]
    out += [("model.norm.weight", (s.hidden,), False), ("lm_head.weight", (s.vocab, s.hidden), True)]
    return out


def weight(name, shape, device):
    """f16 weight `name`: N(0, 0.02) (HF's initializer range) for matrices, U(0.9, 1.1) for norms. The seed is a
    function of the name only, so the same name gives the same tensor on the same kind of device. The package's
    `--load-format random` draws the very same tensors (lowbit/models/random_weights.py)."""
    return random_weight(name, shape, device)


def quantize_w4(w, group=128):
    """Asymmetric group-wise u4 (docs/formats.md, w4): q uint8 [n, k] (one value per byte), scales and zeros
    f16 [n, k / group]."""
    n, k = w.shape
    assert k % group == 0, f"quantize_w4: k={k} is not a multiple of group {group}"
    wf = w.float().view(n, k // group, group)
    lo, hi = wf.amin(-1).clamp(max=0), wf.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 15).half()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    sf = scale.float()
    zero = torch.clamp(torch.round(-lo / sf), 0, 15)
    q = torch.clamp(torch.round(wf / sf.unsqueeze(-1)) + zero.unsqueeze(-1), 0, 15)
    return q.to(torch.uint8).view(n, k), scale, zero.half()


def quantize_two_level(w, fmt, group=128):
    """A fast on-device two-level W4A8 quantizer for benchmark weights (not the calibrated lowbit quantizers):
    level 1 per-channel int8 inside the protective range [-119, 119], level 2 per-group u4 with an integer
    step s in [1, 16] and, for qoq, a zero z (s8 = (q - z) * s, z * s <= 128) or, for liquid, an offset a
    (s8 = q * s + a - 128, q * s + a <= 255; a group whose range does not fit loses its top codes).
    Returns (q uint8 [n, k] one code per byte, steps u8, zeros/offsets u8 [n, k / group], channel scales f32)."""
    n, k = w.shape
    assert k % group == 0, f"quantize_two_level: k={k} is not a multiple of group {group}"
    cs = w.float().abs().amax(-1) / 119
    cs = torch.where(cs == 0, torch.ones_like(cs), cs)
    w8 = torch.clamp(torch.round(w.float() / cs.unsqueeze(-1)), -119, 119).view(n, k // group, group)
    lo, hi = w8.amin(-1), w8.amax(-1)
    step = torch.clamp(torch.ceil((hi - lo) / 15), 1, 16)
    if fmt == "qoq":
        zero = torch.minimum(torch.clamp(torch.round(-lo / step), 0, 15), torch.floor(128 / step))
        q = torch.clamp(torch.round(w8 / step.unsqueeze(-1)) + zero.unsqueeze(-1), 0, 15)
    else:
        zero = torch.minimum(lo + 128, 255 - 15 * step)  # the offset a
        q = torch.clamp(torch.round((w8 - (zero - 128).unsqueeze(-1)) / step.unsqueeze(-1)), 0, 15)
    return q.to(torch.uint8).view(n, k), step.to(torch.uint8), zero.to(torch.uint8), cs


def quantize_w8(w):
    """Per-channel symmetric int8 (docs/formats.md, w8): q int8 [n, k], scales f32 [n]."""
    wf = w.float()
    s = wf.abs().amax(-1) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.clamp(torch.round(wf / s.unsqueeze(-1)), -127, 127)
    return q.to(torch.int8), s


def quantize_e4m3(w):
    """Per-channel e4m3 (docs/formats.md, e4m3): q float8_e4m3fn [n, k] as its uint8 bits, scales f32 [n] =
    max|w| / 448 (1 for a zero row)."""
    wf = w.float()
    s = wf.abs().amax(-1) / 448
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = (wf / s.unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.view(torch.uint8), s
