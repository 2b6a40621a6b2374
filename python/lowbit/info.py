"""A model's facts for `LLM.info()` and `lowbit info`: recipe, memory per weight group and per KV token, kernels."""
from __future__ import annotations

import json
import re
from typing import Any


def quantization_info(source: str) -> dict[str, Any] | None:
    """The key facts of a lowbit quantized directory's manifest (None for other sources)."""
    from pathlib import Path

    from .quantize.export import MANIFEST
    path = Path(source) / MANIFEST if source else None
    if path is None or not path.is_file():
        return None
    m = json.loads(path.read_text(encoding="utf-8"))
    params = {k: v for k, v in m.get("parameters", {}).items() if k != "layers" and _is_scalar(v)}
    out = {"recipe": m["recipe"], "algorithm": m["algorithm"], "weight_format": m["weight_format"],
           "group": m["group"], "activation": m["activation"], "kv": m["kv"], "parameters": params,
           "calibration": m.get("calibration", {}), "quantized_linears": len(m.get("weights", {}))}
    fr = m.get("fmpq_int8_block_fraction")
    if fr:
        out["fmpq_int8_block_fraction_mean"] = sum(fr.values()) / len(fr)
        out["fmpq_int8_block_fraction"] = dict(fr)
    return out


# A decoder linear's name -> (layer, role); q/k/v and gate/up read one input and so share one FMPQ block map.
_LINEAR = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight$")
_ROLE = {"q": "qkv", "k": "qkv", "v": "qkv", "o": "o", "gate": "gate_up", "up": "gate_up", "down": "down"}


def fmpq_blocks_by_layer(fractions: dict[str, float]) -> dict[int, dict[str, float]]:
    """{layer: {role: fraction of its 128-channel activation blocks kept at int8}} from a manifest's
    per-linear fractions (the first linear of a role wins; its siblings share the map)."""
    out: dict[int, dict[str, float]] = {}
    for name, fraction in sorted(fractions.items()):
        hit = _LINEAR.match(name)
        if hit:
            out.setdefault(int(hit.group(1)), {}).setdefault(_ROLE[hit.group(2)], float(fraction))
    return dict(sorted(out.items()))


def format_fmpq_blocks(fractions: dict[str, float]) -> str:
    """`lowbit info --plan` on an FMPQ (w4a4) model: the int8 share of each linear's activation blocks, per layer."""
    lines = ["fmpq int8 activation blocks per layer (the rest are int4)"]
    for layer, roles in fmpq_blocks_by_layer(fractions).items():
        cells = "  ".join(f"{role} {100 * roles[role]:5.1f}%" for role in ("qkv", "o", "gate_up", "down")
                          if role in roles)
        lines.append(f"  layer {layer:>3}  {cells}")
    return "\n".join(lines)


def checkpoint_info(manifest: dict | None) -> dict[str, Any] | None:
    """What an HF quantized checkpoint (AWQ / GPTQ / compressed-tensors) was loaded as; None for other sources."""
    if not manifest or not manifest.get("checkpoint_format"):
        return None
    weights = manifest["weights"].values()
    kinds = sorted({f"{w['format']}{' g' + str(w['group']) if w['group'] else ''}"
                    f"{' symmetric' if w['symmetric'] else (' asymmetric' if w['format'] == 'w4' else '')}"
                    for w in weights})
    return {"format": manifest["checkpoint_format"], "loaded_as": kinds, "quantized_linears": len(manifest["weights"]),
            "input_permutations": sum(bool(w["input_perm"]) for w in weights),
            "requantized_at_load": list(manifest["requantized_at_load"])}


def _is_scalar(v) -> bool:
    return isinstance(v, (bool, int, float, str)) or v is None


def model_info(llm) -> dict[str, Any]:
    from . import _core
    core = llm.model.info()
    cfg = llm.config
    return {
        "quantization": quantization_info(llm.source),
        "checkpoint": checkpoint_info(getattr(llm, "checkpoint_manifest", None)),
        "load_note": getattr(llm, "load_note", None),
        "tensors": getattr(llm, "tensor_report", None),
        "source": llm.source,
        "arch": cfg.arch,
        "layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "heads": cfg.num_heads,
        "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "context": cfg.max_position_embeddings,
        "parameters": llm.num_parameters,
        "recipe": core["recipe"], "dtype": core["dtype"], "device": core["device"],
        # tensor parallelism: the ranks' devices; parameter bytes, KV bytes and kernels below are rank 0's
        "tensor_parallel": getattr(llm, "tensor_parallel", 1),
        "rank_devices": [m.info()["device"] for m in getattr(llm, "models", [llm.model])],
        "tp_all_reduce": llm.model.tp_all_reduce,  # "" without tensor parallelism
        "parameter_bytes": dict(core["parameter_bytes"]),
        "kv_bytes_per_token": core["kv_bytes_per_token"],
        "kernels": list(core["kernels"]),
        "plan": list(llm.model.plan()),
        "engine": dict(llm.engine.stats()),
        "cuda_build": bool(_core.has_cuda_build()),
        "cuda_available": bool(_core.cuda_available()),
        "cuda_libraries": cuda_libraries(),
    }


def cuda_libraries() -> dict[str, bool]:
    """The optional libraries this build found (docs/build.md): cuBLASLt (the f16 GEMM) and NCCL (TP over GPUs)."""
    from . import _core
    return {"cublaslt": any(k["name"] == "gemm_f16_cublaslt" and k["built"] for k in _core.kernels.gemm_kernels()),
            "nccl": bool(_core.nccl_available()[0])}


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def format_info(info: dict[str, Any]) -> str:
    lines = [f"model       {info['source']}",
             f"arch        {info['arch']}: {info['layers']} layers, hidden {info['hidden_size']}, "
             f"{info['heads']}/{info['kv_heads']} heads x {info['head_dim']}, vocab {info['vocab_size']}, "
             f"context {info['context']}, {info['parameters'] / 1e6:.1f}M parameters",
             f"recipe      {info['recipe']} (compute {info['dtype']}, device {info['device']})",
             "weights"]
    if info.get("tensor_parallel", 1) > 1:
        lines.insert(3, f"tensor par. {info['tensor_parallel']} ranks on {', '.join(info['rank_devices'])}, "
                        f"all-reduce {info.get('tp_all_reduce') or '?'} (bytes and kernels below: rank 0's share)")
    q = info.get("quantization")
    if q:
        kv = q["kv"]
        params = ", ".join(f"{k}={v}" for k, v in sorted(q["parameters"].items())) or "-"
        cal = q["calibration"]
        group = f" g{q['group']}" if q["group"] else ""
        lines[3:3] = [
            f"quantized   {q['recipe']} by {q['algorithm']}: {q['weight_format']}{group} weights, "
            f"{q['activation']} activations, KV k{kv['k_bits']}v{kv['v_bits']} ({kv['mode']}), "
            f"{q['quantized_linears']} quantized linears",
            f"  parameters  {params}",
            f"  calibration {cal.get('num_sequences', '?')} x {cal.get('seq_len', '?')} tokens of "
            f"{', '.join(cal.get('files', [])) or '?'}"]
        if "fmpq_int8_block_fraction_mean" in q:
            lines.insert(6, f"  fmpq        int8 blocks: {100 * q['fmpq_int8_block_fraction_mean']:.1f}% (mean over linears)")
    c = info.get("checkpoint")
    if c:
        again = c["requantized_at_load"]
        lines.insert(3, f"checkpoint  {c['format']}: {c['quantized_linears']} linears loaded as stored "
                        f"({', '.join(c['loaded_as'])}; {c['input_permutations']} with act-order input permutations); "
                        f"quantized at load (round to nearest): {', '.join(again) if again else 'none'}")
    if info.get("tensors"):
        from .models.gguf_report import format_tensors
        lines[3:3] = format_tensors(info["tensors"])
    if info.get("load_note"):
        notes = [n.removeprefix("lowbit: ") for n in info["load_note"].splitlines()]
        lines[3:3] = ["loaded      " + notes[0]] + ["            " + n for n in notes[1:]]
    total = 0
    for group, n in sorted(info["parameter_bytes"].items()):
        lines.append(f"  {group:<18}{_mib(n)}")
        total += n
    lines.append(f"  {'total':<18}{_mib(total)}")
    kv = info["kv_bytes_per_token"]
    eng = info["engine"]
    lines.append(f"kv cache    {kv} bytes per token; {eng['num_blocks']} blocks x {eng['block_size']} tokens "
                 f"= {_mib(kv * eng['num_blocks'] * eng['block_size'])}")
    lines.append("kernels     " + (", ".join(info["kernels"]) or "-"))
    libs = info.get("cuda_libraries") or {}
    found = ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in libs.items())
    lines.append(f"cuda        build {'yes' if info['cuda_build'] else 'no'}, "
                 f"device {'available' if info['cuda_available'] else 'not available'}"
                 + (f"; {found}" if info["cuda_build"] and found else ""))
    return "\n".join(lines)


def format_plan(plan: list[dict[str, Any]]) -> str:
    """`lowbit info --plan`: one line per linear role and token bucket and per attention phase: the kernel, its
    descriptor, and why it was chosen (forced, best ranked fit, or a slow fallback with what could not run)."""
    lines = ["plan"]
    width = max((len(p["role"]) for p in plan), default=0)
    for p in plan:
        mark = "  [SLOW FALLBACK]" if p["fallback"] else ""
        lines.append(f"  {p['role']:<{width}}  {p['kernel']}{mark}")
        lines.append(f"  {'':<{width}}    {p['desc']}")
        lines.append(f"  {'':<{width}}    why: {p['why']}")
    return "\n".join(lines)
