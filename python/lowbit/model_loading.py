"""LoadedModel (float numpy tensors, HF names) -> the C++ Model: config translation and weight upload."""
from __future__ import annotations

import re
import sys
import time

from .models import LoadedModel, ModelConfig


def core_config(cfg: ModelConfig):
    """The engine's ModelConfig from the loaders' Python one."""
    from . import _core
    c = _core.ModelConfig()
    c.arch = cfg.arch
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "max_position_embeddings"):
        setattr(c, name, int(getattr(cfg, name)))
    c.rope_theta = float(cfg.rope_theta)
    c.rms_norm_eps = float(cfg.rms_norm_eps)
    c.tie_word_embeddings = bool(cfg.tie_word_embeddings)
    c.attention_bias = bool(cfg.attention_bias)
    c.rope_neox = cfg.rope_pairing == "neox"
    scaling = cfg.rope_scaling
    c.rope_scaling_type = scaling["type"] if scaling else ""
    if scaling:
        c.rope_factor = float(scaling["factor"])
        if scaling["type"] == "llama3":
            c.rope_low_freq_factor = float(scaling["low_freq_factor"])
            c.rope_high_freq_factor = float(scaling["high_freq_factor"])
            c.rope_original_max_position = int(scaling["original_max_position_embeddings"])
    return c


def resolve_recipe(loaded: LoadedModel, recipe: str | None) -> str:
    """The recipe to build: a quantized directory's own (an explicit different one is an error; an HF quantized
    checkpoint also takes one that differs only in the KV cache), else the given one, else w16a16."""
    manifest = getattr(loaded, "manifest", None)
    if manifest is None:
        return recipe or "w16a16"
    from .quantize.recipes import same_recipe, same_weights
    own = manifest["recipe"]
    if recipe is not None and manifest.get("checkpoint_format") and same_weights(recipe, own):
        return recipe  # an HF quantized checkpoint: its weights are fixed, the KV cache is the user's choice
    if recipe is not None and not same_recipe(recipe, own):
        raise ValueError(f"{loaded.source} was quantized for recipe {own!r} (algorithm {manifest['algorithm']}); "
                         f"it cannot run as {recipe!r}: omit the recipe or pass {own!r}")
    return own


def choose_stored(native: dict, recipe: str | None, device: str, source: str, linear_types: dict | None = None):
    """Which recipe to build and which of the file's quantized linears to upload as stored.

    Returns (recipe, fields_to_upload, note). A recipe asking for 4-bit weights with float activations and no
    explicit group ("w4a16", "w4a16kv8", ...), on the CPU or the GPU, keeps the file's g32 grid: it becomes
    "w4a16g32..." and every Q4_0 / Q4_1 linear is uploaded as stored. An explicit other group, another format, or
    a file mixing Q4_0 and Q4_1 linears re-quantize from the exact dequantized values, and the note says so; so does any
    other weight-quantizing recipe over a file whose linears are stored quantized (linear_types: GGUF type -> count
    of the linear weights). Q8_0 linears under "w8a16..." likewise become w8 g32 as stored
    (models/gguf_choice.w8_choice). recipe None (no recipe given) is returned unchanged: use_stored_quantization
    first replaces it by the file's own precision (gguf_choice.file_recipe)."""
    stored = sorted(t for t in (linear_types or {}) if t not in ("F32", "F16", "BF16"))
    if (not native and not stored) or recipe is None:
        return recipe, {}, None
    from .models.gguf_choice import w8_choice
    from .models.gguf_native import GROUP
    from .quantize.recipes import parse_recipe

    spec = parse_recipe(recipe)
    w8_fields = {n: f for n, f in native.items() if f.format == "w8"}  # Q8_0
    native = {n: f for n, f in native.items() if f.format == "w4"}     # Q4_0 / Q4_1
    if w8_fields and spec.weight_format == "w8" and spec.activation == "float16":
        return w8_choice(w8_fields, spec, recipe, source)
    if not native or spec.weight_format != "w4" or spec.activation != "float16":
        if spec.weight_format is None or not stored:  # float weights: the exact dequantized values
            return recipe, {}, None
        group = f" g{spec.group}" if spec.group else ""
        return recipe, {}, (f"lowbit: {source}: recipe {spec.text} re-quantizes the file's {'/'.join(stored)} linears "
                            f"(dequantized exactly first) to {spec.weight_format}{group}")
    types = sorted({f.extra["gguf_type"] for f in native.values()})
    what = "/".join(types)
    explicit = re.match(r"\s*w4a16g(\d+)", recipe.lower())
    if explicit and int(explicit.group(1)) != GROUP:
        return recipe, {}, (f"lowbit: {source}: recipe {recipe!r} re-quantizes the file's {what} weights (groups of "
                            f"{GROUP}) to groups of {explicit.group(1)}; recipe 'w4a16' keeps them as stored")
    if len(types) > 1:
        return recipe, {}, (f"lowbit: {source}: the file mixes {what} linears, which cannot share a fused layer "
                            f"as stored; re-quantized to {spec.text}")
    kept = spec.text if explicit else spec.text.replace("w4a16", f"w4a16g{GROUP}", 1)
    return kept, dict(native), (f"lowbit: {source}: {len(native)} {what} weights loaded as stored "
                                f"(w4 g{GROUP}{' + min' if types == ['Q4_1'] else ''}, no re-quantization); "
                                f"recipe {kept}")


def use_stored_quantization(loaded: LoadedModel, recipe: str | None, device: str, progress: bool = True,
                            dtype: str = "f32") -> str | None:
    """A GGUF file's Q4_0 / Q4_1 linears run as stored when the recipe asks for w4a16 without another group: the
    recipe becomes w4a16g32 and those weights are uploaded as their quantized fields instead of
    being re-quantized from their dequantized values (choose_stored); Q8_0 linears likewise under w8a16 (w8a16g32).
    With no recipe, a GGUF file picks its own (gguf_choice.file_recipe). Linears of other quantized types (K-quants,
    ...) are named in one line saying what they became. Prints what happened once, as one note."""
    from .models import gguf_choice, gguf_native
    native = getattr(loaded, "native_fields", None) or {}
    linear_types = getattr(loaded, "linear_types", None) or {}
    if not native and not linear_types:
        return recipe
    notes = []
    if recipe is None:
        recipe, why = gguf_choice.file_recipe(linear_types)
        if gguf_choice.quantized_types(linear_types):  # a float file runs w16a16 as it always did: nothing to say
            notes.append(f"lowbit: {loaded.source}: no recipe given; {recipe} follows the file ({why})")
    recipe, chosen, note = choose_stored(native, recipe, device, loaded.source, linear_types)
    if chosen:
        loaded.fields = chosen
        for name in chosen:
            loaded.tensors.pop(name, None)
        loaded.head_format = gguf_native.head_format(loaded.head_type)
        head = getattr(loaded, "head_fields", None)
        if head is not None and loaded.head_format == "w8":  # a Q8_0 output layer runs as stored too
            loaded.fields["lm_head.weight"] = head
            loaded.tensors.pop("lm_head.weight", None)
            note += f"; lm_head ({loaded.head_type} in the file) as w8 g{head.group}, stored"
        else:
            note += f"; lm_head ({loaded.head_type} in the file) as {loaded.head_format}"
    notes.append(note)
    from .quantize.recipes import parse_recipe
    types, spec = getattr(loaded, "tensor_types", None) or {}, parse_recipe(recipe)
    notes.append(gguf_choice.dequantized_note(types, set(chosen), spec, dtype, loaded.source))
    notes.append(gguf_choice.float_linears_note(types, set(chosen), spec, loaded.source))
    notes = [n for n in notes if n]
    loaded.load_note = "\n".join(notes) or None
    if notes and progress:
        print(loaded.load_note, file=sys.stderr, flush=True)
    return recipe


def check_engine_can_run(loaded: LoadedModel) -> None:
    """A quantized directory's options the engine does not implement fail here, by name (never ignored)."""
    manifest = getattr(loaded, "manifest", None)
    if manifest is None:
        return
    kv = manifest["kv"]
    from . import _core
    per_channel_k = _core.parse_recipe(manifest["recipe"])["k_per_channel"]
    if (kv["k_bits"] < 16 or kv["v_bits"] < 16) and kv["mode"] == "channel" and not per_channel_k:
        raise NotImplementedError(
            f"{loaded.source}: kv_mode 'channel' (per-channel K ranges) was calibrated for recipe "
            f"{manifest['recipe']!r}, whose K is per token; re-quantize with a per-channel K recipe (kc4v4, kc2v2, ...) or "
            "--kv-mode token, or evaluate the directory with lowbit.quantize.api.fake_quant_model")
    if (kv["k_bits"] < 16 or kv["v_bits"] < 16) and kv["mode"] not in ("token", "channel"):
        raise NotImplementedError(
            f"{loaded.source}: kv_mode {kv['mode']!r} (static calibrated KV ranges) is not implemented by the engine, whose KV cache quantizes per token and head; re-quantize with "
            "--kv-mode token, or evaluate the directory with lowbit.quantize.api.fake_quant_model")


def core_quantized_weight(f):
    """A QuantFields (python/lowbit/quantize/formats.py) as the engine's QuantizedWeight."""
    from . import _core
    return _core.QuantizedWeight(f.format, f.q, f.scales, f.zeros, f.channel_scales, f.group, f.symmetric,
                                 mins=getattr(f, "mins", None))


def _upload(models: list, loaded: LoadedModel, names: list[str], recipe: str, device: str, progress: bool) -> None:
    """Every tensor to every model; a tensor-parallel rank keeps its shard of what it is given (each tensor is read
    once and given to all ranks)."""
    fields = getattr(loaded, "fields", {})
    total = len(names) + len(fields)
    for i, name in enumerate(list(fields) + names, 1):
        if name in fields:
            f = fields[name]
            weight = core_quantized_weight(f)
            for model in models:
                model.set_quantized_weight(name, weight)
                if "input_perm" in f.extra:
                    model.set_input_permutation(name, f.extra["input_perm"])
                if "fmpq_block_bits" in f.extra:
                    model.set_fmpq_block_bits(name, f.extra["fmpq_block_bits"])
        else:
            tensor = loaded.tensors[name]
            for model in models:
                model.set_weight(name, tensor)
        if progress and (i % 25 == 0 or i == total):
            print(f"\rlowbit: packing weights ({recipe}, {device}) {i}/{total}", end="", file=sys.stderr, flush=True)


TP_BACKENDS = ("auto", "nccl", "threads")


def tensor_parallel_group(world: int, device: str, backend: str = "auto") -> tuple[list, list[str]]:
    """(communicators, device of each rank) for `world` ranks. On the CPU the ranks are threads. On GPUs, "nccl"
    (the default) puts rank r on cuda:(i + r) where device is cuda:i; "threads" keeps every rank on `device` and
    exchanges through host memory (no CUDA graphs): sharded math on one GPU, for tests."""
    from . import _core
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"tensor_parallel must be a positive integer, got {world!r}")
    if backend not in TP_BACKENDS:
        raise ValueError(f"tensor_parallel_backend must be one of {', '.join(TP_BACKENDS)}, got {backend!r}")
    device = str(device)
    if not device.startswith("cuda") or backend == "threads":
        if backend == "nccl":
            raise ValueError(f"tensor_parallel_backend 'nccl' needs CUDA devices, got device {device!r}")
        return _core.make_thread_communicators(world), [device] * world
    first = int(device.partition(":")[2] or 0)
    ok, why = _core.nccl_available()
    if not ok:
        raise NotImplementedError(f"tensor_parallel={world} on {device}: {why}")
    devices = list(range(first, first + world))
    # small all-reduces take the one-shot peer-memory kernel when the GPUs have peer access (LOWBIT_TP_ONESHOT=0: off)
    return _core.make_nccl_communicators(devices), [f"cuda:{d}" for d in devices]


def build_model(loaded: LoadedModel, recipe: str, device: str, dtype: str, progress: bool = True,
                kernel_overrides: dict[str, str] | None = None, strict: bool = False, tensor_parallel: int = 1,
                tensor_parallel_backend: str = "auto"):
    """Upload every tensor and finalize; progress goes to stderr. Float linears are quantized per the recipe in
    C++; a quantized directory's fields (a QuantizedCheckpoint) are uploaded as they are, with their input
    permutations and FMPQ block maps. kernel_overrides / strict go to Model.set_kernel_options: finalize resolves
    the execution plan with them (a forced kernel that cannot run, or a fallback under strict, raises there).
    tensor_parallel > 1 returns the group's models in rank order (tensor_parallel_group says where they run)."""
    from . import _core
    check_engine_can_run(loaded)
    comms, devices = tensor_parallel_group(tensor_parallel, device, tensor_parallel_backend) \
        if tensor_parallel != 1 else ([None], [device])
    models = []
    for comm, rank_device in zip(comms, devices):
        model = _core.Model(core_config(loaded.config), recipe, rank_device, dtype)
        if comm is not None:
            model.set_tensor_parallel(comm)
        model.set_kernel_options({str(k): str(v) for k, v in (kernel_overrides or {}).items()}, bool(strict))
        if getattr(loaded, "head_format", None):
            model.set_head_format(loaded.head_format)
        models.append(model)
    names = list(loaded.tensors)
    if loaded.config.tie_word_embeddings:
        names = [n for n in names if n != "lm_head.weight"]
    start = time.perf_counter()
    _upload(models, loaded, names, recipe, device, progress)
    for model in models:
        model.finalize()
    if progress:
        print(f" done in {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
        if len(models) > 1:
            print(f"lowbit: tensor parallel {len(models)} ranks, all-reduce: {models[0].tp_all_reduce}",
                  file=sys.stderr, flush=True)
    return models[0] if tensor_parallel == 1 else models
