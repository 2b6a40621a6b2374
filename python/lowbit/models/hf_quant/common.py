"""Pieces every HF quantized-checkpoint reader shares: raw tensor access with the file each tensor came from,
int32 bit unpacking, and the exact conversions into lowbit's QuantizedWeight fields (include/lowbit/quant/format.h).

Nothing here dequantizes: integers stay integers, scales are converted only where the conversion is exact, and
anything lowbit cannot hold exactly raises CheckpointFormatError naming the file and the tensor or config field."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...quant_fields import QuantFields

# Decoder linears of the Llama family, by module name (the weight is `<module>.weight`).
LINEAR_SUFFIXES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# Linears that read one input: the engine fuses them, so they need one input permutation and one symmetry.
SHARED_INPUT = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))
LOWBIT_GROUPS = (128, 64, 32)  # w4 / w8 group sizes the engine has kernels for, largest first


class CheckpointFormatError(ValueError):
    """A quantized checkpoint lowbit cannot represent exactly (or a malformed one); the message names the field."""


def linear_modules(config) -> list[str]:
    """Every linear module name of a model of this config, lm_head last (when it is not tied)."""
    names = [f"model.layers.{i}.{s}" for i in range(config.num_layers) for s in LINEAR_SUFFIXES]
    return names + ([] if config.tie_word_embeddings else ["lm_head"])


def linear_shape(config, module: str) -> tuple[int, int]:
    """[n, k] of a linear module's weight."""
    from ..shapes import expected_shapes
    return expected_shapes(config)[module + ".weight"]


class RawTensors:
    """Every tensor of the checkpoint's safetensors files in its stored dtype (torch), with its file."""

    def __init__(self, files: list[Path]):
        from safetensors import safe_open
        self.tensors, self.file_of = {}, {}
        for f in files:
            try:
                handle = safe_open(str(f), framework="pt")
            except Exception as e:  # safetensors raises its own error type for bad headers
                raise ValueError(f"{f}: not a readable safetensors file ({e})") from e
            with handle:
                for name in handle.keys():
                    if name in self.tensors:
                        raise CheckpointFormatError(f"{f}: tensor {name!r} appears in more than one shard")
                    self.tensors[name] = handle.get_tensor(name)
                    self.file_of[name] = f.name

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def where(self, name: str) -> str:
        return f"{self.file_of.get(name, '?')}: tensor {name!r}"

    def pop(self, name: str, what: str, dtypes=None, shape=None):
        """Remove and return a tensor; missing, a wrong dtype or a wrong shape raise, naming the tensor."""
        if name not in self.tensors:
            raise CheckpointFormatError(f"{what}: tensor {name!r} is missing from the checkpoint")
        t = self.tensors[name]
        if dtypes is not None and t.dtype not in dtypes:
            raise CheckpointFormatError(f"{what}: {self.where(name)} has dtype {t.dtype}, expected "
                                        f"{' or '.join(str(d) for d in dtypes)}")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise CheckpointFormatError(f"{what}: {self.where(name)} has shape {list(t.shape)}, expected {list(shape)}")
        del self.tensors[name]
        return t


def unpack_int32(packed, bits: int, count: int) -> np.ndarray:
    """Unpack values of `bits` bits from int32 words along the last axis, value i of a word in bits
    [i*bits, (i+1)*bits) (GPTQ, compressed-tensors and, before AWQ's column interleave, AutoAWQ): -> uint8 [..., count]."""
    words = np.ascontiguousarray(packed.numpy() if hasattr(packed, "numpy") else packed).view(np.uint32)
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits)
    vals = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return vals.reshape(*words.shape[:-1], words.shape[-1] * per)[..., :count].astype(np.uint8)


def exact_f16(t, what: str) -> np.ndarray:
    """Scales as f16 (w4's scale type), only if every value converts exactly and is finite and positive."""
    import torch
    t = t.detach()
    h = t.to(torch.float16)
    if t.dtype != torch.float16 and not torch.equal(h.to(t.dtype), t):
        bad = int((h.to(t.dtype) != t).sum())
        raise CheckpointFormatError(f"{what}: {bad} {t.dtype} scale(s) are not exactly representable in f16, the "
                                    "scale type of lowbit's w4 format; lowbit does not round scales")
    return _positive(h.numpy(), what)


def exact_f32(t, what: str) -> np.ndarray:
    """Scales as f32 (w8 / e4m3 scale type): f16, bf16 and f32 all convert exactly."""
    import torch
    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise CheckpointFormatError(f"{what}: scales have dtype {t.dtype}, expected a float type")
    return _positive(t.detach().float().numpy(), what)


def _positive(s: np.ndarray, what: str) -> np.ndarray:
    ok = np.isfinite(s.astype(np.float32)) & (s > 0)
    if not ok.all():
        idx = np.argwhere(~ok)[0].tolist()
        raise CheckpointFormatError(f"{what}: scale {s[tuple(idx)]} at index {idx} is not finite and positive "
                                    "(lowbit's formats need positive scales)")
    return s


def lowbit_group(file_group: int, k: int, what: str) -> int:
    """lowbit's group for a checkpoint group of `file_group` columns: the largest of 128/64/32 that divides it
    (each lowbit group then lies inside one checkpoint group, so repeating the scale is exact), 128 for one
    group per row (per-channel)."""
    if file_group >= k:
        return 128
    for g in LOWBIT_GROUPS:
        if file_group % g == 0:
            return g
    raise CheckpointFormatError(f"{what}: group size {file_group} cannot be represented exactly: lowbit's w4 and "
                                f"w8 groups are {', '.join(map(str, LOWBIT_GROUPS))} columns and a checkpoint group "
                                "must be a multiple of one of them")


def regroup(per_file_group: np.ndarray, file_group: int, group: int, k: int) -> np.ndarray:
    """[n, G_file] -> [n, ceil(k / group)]: each lowbit group takes the value of the checkpoint group it lies in."""
    starts = np.arange(0, k, group)
    return per_file_group[:, np.minimum(starts // file_group, per_file_group.shape[1] - 1)]


def w4_fields(what: str, q: np.ndarray, scales, zeros: np.ndarray | None, file_group: int, group: int) -> QuantFields:
    """QuantFields of lowbit's w4 from unpacked integers q u8 [n, k] (0..15), per-checkpoint-group scales
    (torch, [n, G_file]) and zeros (int [n, G_file], 0..15; None = symmetric, zero 8)."""
    n, k = q.shape
    if q.max(initial=0) > 15:
        raise CheckpointFormatError(f"{what}: 4-bit values above 15 after unpacking")
    f = QuantFields("w4", n, k, group, zeros is None)
    f.q = np.ascontiguousarray(q, dtype=np.uint8)
    f.scales = np.ascontiguousarray(regroup(exact_f16(scales, what + " scales"), file_group, group, k))
    if zeros is not None:
        if zeros.min(initial=0) < 0 or zeros.max(initial=0) > 15:
            raise CheckpointFormatError(f"{what}: zero points must lie in [0, 15] for lowbit's w4, got "
                                        f"[{zeros.min()}, {zeros.max()}]")
        f.zeros = np.ascontiguousarray(regroup(zeros.astype(np.float16), file_group, group, k))
    return f


def perm_from_g_idx(g_idx, file_group: int, k: int, what: str) -> np.ndarray | None:
    """The input permutation that makes act-order groups contiguous (None when they already are): sorting the
    input channels by g_idx (stable) puts group j's channels at [j*group, (j+1)*group); the engine then feeds
    x[:, perm] to the weight whose columns were permuted the same way, which is the same dot product."""
    g = np.asarray(g_idx.numpy() if hasattr(g_idx, "numpy") else g_idx).astype(np.int64).reshape(-1)
    if g.shape != (k,):
        raise CheckpointFormatError(f"{what}: g_idx has shape {list(g.shape)}, expected [{k}]")
    contiguous = np.arange(k) // file_group
    if np.array_equal(g, contiguous):
        return None
    perm = np.argsort(g, kind="stable")
    if not np.array_equal(g[perm], contiguous):
        raise CheckpointFormatError(f"{what}: g_idx does not give every group exactly {file_group} input channels "
                                    "(the last may be short), so no permutation makes the groups contiguous")
    return perm


def check_shared_inputs(fields: dict[str, QuantFields], config, source: str) -> None:
    """Linears the engine fuses (q/k/v, gate/up) must agree on symmetry and input permutation; say which differ
    here, by tensor name, rather than at the engine's finalize."""
    for i in range(config.num_layers):
        for group in SHARED_INPUT:
            names = [f"model.layers.{i}.{s}.weight" for s in group]
            present = [n for n in names if n in fields]
            if len(present) not in (0, len(names)):
                raise CheckpointFormatError(f"{source}: {', '.join(names)} read one input and must all be quantized "
                                            f"or all float; only {', '.join(present)} are quantized")
            for n in present[1:]:
                a, b = fields[present[0]], fields[n]
                if (a.format, a.group, a.symmetric) != (b.format, b.group, b.symmetric):
                    raise CheckpointFormatError(
                        f"{source}: {present[0]} ({a.format} g{a.group} symmetric={a.symmetric}) and {n} ({b.format} "
                        f"g{b.group} symmetric={b.symmetric}) read one input, so lowbit fuses them; they must match")
                pa, pb = a.extra.get("input_perm"), b.extra.get("input_perm")
                if (pa is None) != (pb is None) or (pa is not None and not np.array_equal(pa, pb)):
                    raise CheckpointFormatError(f"{source}: {present[0]} and {n} read one input but their g_idx give "
                                                "different input orders (act-order groups); lowbit permutes the "
                                                "shared input once, so they must be equal")
