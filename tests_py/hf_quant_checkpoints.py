"""Small random Llama checkpoints in the AutoAWQ, GPTQ and compressed-tensors layouts, for the loader tests.

Each writer packs integers the way the producing library does (the function followed is named at each packer;
the code is ours, in numpy) and returns the dense float weights the checkpoint means, computed here from the
integers and scales the writer chose, never from lowbit's reader. Random integers, zero points and scales,
never zeros."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from lowbit.quantize.testing import tiny_llama

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def base_model(seed=0, tie=False, arch="llama"):
    """hidden 256 (head_dim 64), intermediate 384: k = 256 and 384 hold whole groups of 128 (AWQ needs that).
    arch "qwen2" adds the q/k/v biases Qwen2 checkpoints keep in float beside the quantized weights."""
    m = tiny_llama(seed, hidden=256, intermediate=384, layers=2, heads=4, kv_heads=2)
    rng = np.random.default_rng(seed + 100)
    if not tie:
        m.tensors["lm_head.weight"] = (rng.standard_normal((256, 256)) / 16).astype(np.float32)
        m.config = dataclasses.replace(m.config, tie_word_embeddings=False)
    if arch == "qwen2":
        m.config = dataclasses.replace(m.config, arch="qwen2", attention_bias=True)
        for i in range(m.config.num_layers):
            for proj in ("q_proj", "k_proj", "v_proj"):
                n = m.tensors[f"model.layers.{i}.self_attn.{proj}.weight"].shape[0]
                m.tensors[f"model.layers.{i}.self_attn.{proj}.bias"] = rng.uniform(-0.5, 0.5, n).astype(np.float32)
    return m


def modules(model):
    c = model.config
    return [f"model.layers.{i}.{s}" for i in range(c.num_layers) for s in LINEARS]


def random_w4(rng, n, k, group, sym, g_idx=None, min_zero=0):
    """(q u8 [n, k], scales f16 [n, G], zeros int [n, G], dense f32 [n, k]) with w = (q - zero) * scale per the
    group of each input channel (g_idx; default c // group). min_zero 1 for GPTQ v1, whose stored zero - 1 has
    no field for zero 0 (auto-gptq's asymmetric zeros are >= 1 unless a whole group is >= 0)."""
    g_idx = np.arange(k) // group if g_idx is None else g_idx
    groups = int(g_idx.max()) + 1
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    scales = (rng.uniform(0.5, 1.5, (n, groups)) / (4 * np.sqrt(k))).astype(np.float16)
    zeros = np.full((n, groups), 8) if sym else rng.integers(min_zero, 16, (n, groups))
    dense = (q.astype(np.float32) - zeros[:, g_idx]) * scales.astype(np.float32)[:, g_idx]
    return q, scales, zeros, dense.astype(np.float32)


def pack_rows_lsb_first(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack along the last axis, value i of each int32 word in bits [i*bits, (i+1)*bits) (GPTQ's pack, and
    compressed-tensors' pack_to_int32 for 4 and 8 bits): [..., m] (m a multiple of 32/bits) -> int32 [..., m*bits/32]."""
    per = 32 // bits
    v = values.astype(np.uint32).reshape(*values.shape[:-1], values.shape[-1] // per, per)
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(per):
        words |= v[..., i] << np.uint32(i * bits)
    return words.view(np.int32)


def save(directory: Path, model, tensors: dict, qc: dict | None) -> Path:
    """An HF directory: config (with `qc` as quantization_config unless None), tokenizer, safetensors."""
    from safetensors.torch import save_file
    import torch
    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_hf_config()
    if qc is not None:
        cfg["quantization_config"] = qc
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    model.tokenizer.save(directory)
    out = {k: (torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v.contiguous())
           for k, v in tensors.items()}
    save_file(out, str(directory / "model.safetensors"))
    return directory


def write_float_dir(directory: Path, model) -> Path:
    """The model as a plain f16 HF directory: the input the real quantizer libraries (AutoAWQ, gptqmodel,
    llm-compressor) read."""
    return save(directory, model, {k: v.astype(np.float16) for k, v in model.tensors.items()}, None)


def float_part(model, dtype="f16"):
    """The non-linear tensors (and lm_head), stored in f16 as the producers save them; dense copies in f32."""
    import torch
    td = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    stored, dense = {}, {}
    for name, t in model.tensors.items():
        if not name.endswith("proj.weight"):
            stored[name] = torch.from_numpy(t).to(td)
            dense[name] = stored[name].float().numpy()
    return stored, dense


# ---- AutoAWQ (GEMM) -------------------------------------------------------------------------------------------
def write_awq(directory: Path, seed=0, group=128, tie=False, arch="llama"):
    """AutoAWQ's WQLinear_GEMM.from_linear: intweight [k, n] (input rows); word c of a row gets output channel
    8c + AWQ_ORDER[i] at bits 4i; qzeros [k/g, n/8] packed the same way; scales f16 [k/g, n]."""
    model, rng = base_model(seed, tie, arch), np.random.default_rng(seed + 1)
    tensors, dense = float_part(model)
    for m in modules(model):
        n, k = model.tensors[m + ".weight"].shape
        q, scales, zeros, w = random_w4(rng, n, k, group, sym=False)
        order = np.array([8 * c + o for c in range(n // 8) for o in AWQ_ORDER])  # field index -> output channel
        tensors[m + ".qweight"] = pack_rows_lsb_first(q.T[:, order], 4)
        tensors[m + ".qzeros"] = pack_rows_lsb_first(zeros.T[:, order], 4)
        tensors[m + ".scales"] = np.ascontiguousarray(scales.T)
        dense[m + ".weight"] = w
    qc = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
          "modules_to_not_convert": None}
    return save(directory, model, tensors, qc), model, dense


def awq_unpack_reference(qweight: np.ndarray) -> np.ndarray:
    """An independent reading of AutoAWQ's layout (awq/utils/packing_utils.py: unpack_awq shifts every word by
    0, 4, ..., 28, then reverse_awq_order takes columns [0, 4, 1, 5, 2, 6, 3, 7] of each block of 8): -> [k, n]."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    fields = ((qweight.view(np.uint32)[:, :, None] >> shifts) & 0xF).reshape(qweight.shape[0], -1)
    reverse = np.array([0, 4, 1, 5, 2, 6, 3, 7])
    idx = (np.arange(fields.shape[1]).reshape(-1, 8)[:, reverse]).reshape(-1)
    return fields[:, idx]


# ---- GPTQ ------------------------------------------------------------------------------------------------------
def write_gptq(directory: Path, seed=0, group=128, sym=True, desc_act=False, fmt="gptq", bits=4, lm_head=False,
               extra_qc=None, gptqmodel_v1=False):
    """GPTQModel's BaseQuantLinear.pack_block / auto-gptq's QuantLinear.pack: qweight [k/8, n] packs input channels
    down the rows (channel 8r+i at bits 4i of row r); qzeros [G, n/8] packs output channels along the row; scales
    [G, n]; g_idx [k]. fmt "gptq" (v1) stores zero - 1 in each 4-bit field, "gptq_v2" the zero.
    gptqmodel_v1: v1 as GPTQModel exports it (convert_gptq_v2_to_v1_format): zeros from 0, each packed int32 word
    minus 0x11111111 (a zero of 0 borrows from the next field), and meta.quantizer naming gptqmodel.
    desc_act: a random act-order permutation, g_idx[perm[i]] = i // group as GPTQ's act-order sets it, and all
    linears reading one input share it (GPTQ derives it from that input's Hessian)."""
    model, rng = base_model(seed), np.random.default_rng(seed + 2)
    tensors, dense = float_part(model)
    perms = {}
    names = modules(model) + (["lm_head"] if lm_head else [])
    for m in names:
        n, k = model.tensors[m + ".weight"].shape
        file_group = k if group == -1 else group
        g_idx = np.arange(k) // file_group
        if desc_act and m != "lm_head":
            key = (m.rsplit(".", 2)[0], "attn" if "self_attn" in m and "o_proj" not in m else m)
            key = (m.split(".mlp.")[0], "mlp_in") if m.endswith(("gate_proj", "up_proj")) else key
            perm = perms.setdefault(key, rng.permutation(k))
            g_idx = np.empty(k, dtype=np.int64)
            g_idx[perm] = np.arange(k) // file_group
        per_field_v1 = fmt == "gptq" and not gptqmodel_v1
        q, scales, zeros, w = random_w4(rng, n, k, file_group, sym, g_idx, min_zero=1 if per_field_v1 else 0)
        tensors[m + ".qweight"] = np.ascontiguousarray(pack_rows_lsb_first(q, 4).T)  # [k/8, n]
        if per_field_v1:
            tensors[m + ".qzeros"] = pack_rows_lsb_first(((zeros - 1) & 0xF).T, 4)
        else:
            words = pack_rows_lsb_first(zeros.T, 4).view(np.uint32)
            tensors[m + ".qzeros"] = (words - np.uint32(0x11111111 if fmt == "gptq" else 0)).view(np.int32)
        tensors[m + ".scales"] = np.ascontiguousarray(scales.T)
        tensors[m + ".g_idx"] = g_idx.astype(np.int32)
        dense[m + ".weight"] = w
    if lm_head:
        tensors.pop("lm_head.weight")
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act, "sym": sym,
          "checkpoint_format": fmt, "lm_head": lm_head, "static_groups": False, "true_sequential": True}
    if gptqmodel_v1:
        qc["meta"] = {"quantizer": ["gptqmodel:7.7.0"]}
    qc.update(extra_qc or {})
    return save(directory, model, tensors, qc), model, dense


def write_gptq_w8(directory: Path, seed=0):
    """8-bit GPTQ, one group per row, symmetric: zero 128 (v2 format), 4 values per int32."""
    model, rng = base_model(seed), np.random.default_rng(seed + 3)
    tensors, dense = float_part(model)
    for m in modules(model):
        n, k = model.tensors[m + ".weight"].shape
        q = rng.integers(0, 256, (n, k)).astype(np.uint8)
        scales = (rng.uniform(0.5, 1.5, (1, n)) / (64 * np.sqrt(k))).astype(np.float16)
        tensors[m + ".qweight"] = np.ascontiguousarray(pack_rows_lsb_first(q, 8).T)
        tensors[m + ".qzeros"] = pack_rows_lsb_first(np.full((1, n), 128), 8)
        tensors[m + ".scales"] = scales
        tensors[m + ".g_idx"] = np.zeros(k, dtype=np.int32)
        dense[m + ".weight"] = ((q.astype(np.float32) - 128) * scales.astype(np.float32).T).astype(np.float32)
    qc = {"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": False, "sym": True,
          "checkpoint_format": "gptq_v2"}
    return save(directory, model, tensors, qc), model, dense


# ---- compressed-tensors ----------------------------------------------------------------------------------------
def ct_config(num_bits, kind, strategy, group, symmetric, fmt, ignore=("lm_head",), activations=None):
    """quantization_config as llm-compressor writes it (compressed_tensors.QuantizationConfig fields);
    activations "int8" / "fp8": dynamic per-token symmetric input activations (the W8A8 / FP8_DYNAMIC presets)."""
    inputs = None if activations is None else {
        "num_bits": 8, "type": "int" if activations == "int8" else "float", "symmetric": True, "strategy": "token",
        "dynamic": True, "group_size": None, "actorder": None, "observer": None, "observer_kwargs": {},
        "block_structure": None}
    weights = {"num_bits": num_bits, "type": kind, "symmetric": symmetric, "strategy": strategy,
               "group_size": group if strategy == "group" else None, "dynamic": False, "actorder": None,
               "observer": "minmax", "observer_kwargs": {}, "block_structure": None}
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs,
                                          "output_activations": None, "format": fmt}},
            "ignore": list(ignore), "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
            "global_compression_ratio": None, "version": "0.20.0"}


def write_ct(directory: Path, scheme: str, seed=0, quantize_lm_head=False, scale_dtype="bf16", activations=None):
    """compressed-tensors' PackedQuantizationCompressor.compress / pack_to_int32: signed values + 2^(bits-1),
    packed along the row (zero points along dim 0); float-quantized stores the fp8 tensor itself.
    scheme: w4_group_sym | w4_group_asym | w4_channel_sym | w8_channel | w8_group | fp8_channel | fp8_tensor."""
    import torch
    model, rng = base_model(seed), np.random.default_rng(seed + 4)
    tensors, dense = float_part(model, "bf16")
    sd = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[scale_dtype]
    names = modules(model) + (["lm_head"] if quantize_lm_head else [])
    if quantize_lm_head:
        tensors.pop("lm_head.weight")  # the float copy; the quantized one is written below
    for m in names:
        n, k = model.tensors[m + ".weight"].shape
        if scheme.startswith("w4"):
            group = 64 if "group" in scheme else k
            sym = scheme.endswith("_sym")
            q, scales, zeros, _ = random_w4(rng, n, k, group, sym)
            s = torch.from_numpy(scales.astype(np.float32)).to(sd)  # bf16 ~1e-3: a value f16 holds exactly
            w = ((q.astype(np.float32) - zeros[:, np.arange(k) // group]) *
                 s.float().numpy()[:, np.arange(k) // group]).astype(np.float32)
            tensors[m + ".weight_packed"] = pack_rows_lsb_first(q, 4)  # q here is already signed + 8
            tensors[m + ".weight_scale"] = s
            tensors[m + ".weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
            if not sym:
                tensors[m + ".weight_zero_point"] = np.ascontiguousarray(pack_rows_lsb_first(
                    np.ascontiguousarray(zeros.T), 4).T)  # along dim 0: [n/8, G]
        elif scheme in ("w8_channel", "w8_group"):  # w8_group: llm-compressor's W8A16 preset, here in groups of 64
            q = rng.integers(-128, 128, (n, k)).astype(np.int8)
            cols = np.arange(k) // 64 if scheme == "w8_group" else np.zeros(k, dtype=np.int64)
            s = torch.from_numpy((rng.uniform(0.5, 1.5, (n, cols[-1] + 1)) / (64 * np.sqrt(k))).astype(np.float32)).to(sd)
            w = (q.astype(np.float32) * s.float().numpy()[:, cols]).astype(np.float32)
            tensors[m + ".weight_packed"] = pack_rows_lsb_first((q.astype(np.int16) + 128).astype(np.uint8), 8)
            tensors[m + ".weight_scale"] = s
            tensors[m + ".weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
        else:  # fp8
            v = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32) * 100).to(torch.float8_e4m3fn)
            shape = (n, 1) if scheme == "fp8_channel" else (1,)
            s = torch.from_numpy((rng.uniform(0.5, 1.5, shape) / (100 * np.sqrt(k))).astype(np.float32)).to(sd)
            w = (v.float() * s.float()).numpy().astype(np.float32)
            tensors[m + ".weight"] = v
            tensors[m + ".weight_scale"] = s
        dense[m + ".weight"] = w
    bits = 4 if scheme.startswith("w4") else 8
    kind = "float" if scheme.startswith("fp8") else "int"
    strategy = "group" if "group" in scheme else "tensor" if scheme == "fp8_tensor" else "channel"
    fmt = "float-quantized" if kind == "float" else "pack-quantized"
    qc = ct_config(bits, kind, strategy, 64, not scheme.endswith("_asym"), fmt,
                   ignore=() if quantize_lm_head else ("lm_head",), activations=activations)
    return save(directory, model, tensors, qc), model, dense
