"""Layers only point down: the C++ sources' #include lines keep the map of docs/architecture.md.

From the bottom: core (tensors, devices, dtypes, and the small parameter types every layer shares: RopeConfig,
SamplingParams) -> quant (formats, packers and their layouts) beside kv (the paged cache, AttentionMeta) ->
kernels (CPU and GPU kernels, the GPU runtime and launch interfaces of cuda/, descriptors, registries) -> ops
(argument checks, plans) -> model -> engine. A lower layer that includes a higher one makes the two one
component (a kernel change rebuilds and retests the ops; a type has two homes). Reads the sources, so it skips
where the tests run without them (an installed copy)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INCLUDE_ROOTS = ("cpp", "include")  # the -I folders: "kernels/cpu/x.h" is cpp/..., "lowbit/ops/ops.h" include/...
SUFFIXES = (".h", ".cuh", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
no_sources = pytest.mark.skipif(
    not (ROOT / "cpp").is_dir(),
    reason=f"no C++ sources at {ROOT / 'cpp'} (tests run from an installed copy): nothing to scan")

# Include prefixes of each layer, as written after the -I folders (public "lowbit/x/" or private "x/").
OPS = ("lowbit/ops/", "ops/")
MODEL = ("lowbit/model/", "model/")
ENGINE = ("lowbit/engine/", "engine/")
KERNELS = ("lowbit/kernels/", "kernels/")
CUDA = ("lowbit/cuda/", "cuda/")
QUANT = ("lowbit/quant/", "quant/")
KV = ("lowbit/kv/", "kv/")
DIST = ("lowbit/dist/", "dist/")
ABOVE_KERNELS = OPS + MODEL + ENGINE

# layer folder -> include prefixes it must not use. Each public folder has the same rule as its sources.
RULES = {
    # core: tensors, devices, dtypes, errors and the shared parameter types (core/rope_config.h,
    # core/sampling_params.h). The bottom: it includes nothing of lowbit but itself.
    "include/lowbit/core": ABOVE_KERNELS + KERNELS + CUDA + QUANT + KV + DIST,
    "cpp/core": ABOVE_KERNELS + KERNELS + CUDA + QUANT + KV + DIST,
    # dist: the collectives of tensor parallelism (threads, NCCL on cuda/'s streams); above core and the GPU
    # runtime, below the model whose forward calls them. It knows nothing of weights, KV or kernels.
    "include/lowbit/dist": ABOVE_KERNELS + KERNELS + QUANT + KV,
    "cpp/dist": ABOVE_KERNELS + KERNELS + QUANT + KV,
    # quant: weight formats, recipes, packers and their layouts. Below every kernel: the CPU GEMM layout
    # (cpp/quant/pack_cpu_layout.h) is quant's, the packer writes it and the CPU kernels read it, so quant never
    # includes kernels/ (nor the GPU launchers of cuda/, which include quant/pack.h). Beside kv: neither needs
    # the other; should one ever do, choose the order here and in docs/architecture.md.
    "include/lowbit/quant": ABOVE_KERNELS + KERNELS + CUDA + KV,
    "cpp/quant": ABOVE_KERNELS + KERNELS + CUDA + KV,
    # kv: the paged KV cache and AttentionMeta (kv/attention_meta.h), below the attention kernels that read
    # them and the ops that check them; beside quant (above).
    "include/lowbit/kv": ABOVE_KERNELS + KERNELS + CUDA + QUANT,
    "cpp/kv": ABOVE_KERNELS + KERNELS + CUDA + QUANT,
    # kernels: CPU kernels (kernels/cpu), GPU kernels (kernels/sm80, kernels/sm90), descriptors, registries and
    # kernel options; they take the shared types from core, quant and kv, never from ops.h.
    "include/lowbit/kernels": ABOVE_KERNELS,
    "cpp/kernels": ABOVE_KERNELS,
    # cuda: the GPU runtime (streams, graphs, checks), the launch interfaces the registries call and the
    # forward kernels (rope, rows, sampling, kv_write). Part of the kernel layer: it and kernels/ may include
    # each other's headers, neither points up.
    "include/lowbit/cuda": ABOVE_KERNELS,
    "cpp/cuda": ABOVE_KERNELS,
    # ops: argument checks and kernel choice per call; below the model that runs them.
    "include/lowbit/ops": MODEL + ENGINE,
    "cpp/ops": MODEL + ENGINE,
    # model: weights, plans, the forward pass, CUDA graphs; below the engine that schedules it.
    "include/lowbit/model": ENGINE,
    "cpp/model": ENGINE,
}
TOP = ("include/lowbit/engine", "cpp/engine")  # the top of the C++ layers: may include every layer

# (file, include as written) -> why it must stay. None today: every upward include has been removed. An entry
# here is a debt to pay down, not a way around the rule; one that no longer occurs fails the test below.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def includes(path: Path, root: Path = ROOT) -> list[str]:
    """The lowbit includes of a file, spelled as after the -I folders: quoted ones, and angle ones that name a
    lowbit/ header (others are system or third-party headers: <cuda/pipeline> is libcu++, not cpp/cuda). A quoted
    include found next to the file, as the compiler looks first (`"../ops/op_checks.h"`, `"weight_checks.h"`),
    is rewritten to its path under cpp/ or include/ so that a relative path cannot hide an upward include."""
    found = []
    for bracket, inc in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
        if bracket == "<" and not inc.startswith("lowbit/"):
            continue
        if bracket == '"' and (path.parent / inc).is_file():
            local = (path.parent / inc).resolve()
            for base in INCLUDE_ROOTS:
                if local.is_relative_to((root / base).resolve()):
                    inc = local.relative_to((root / base).resolve()).as_posix()
                    break
        found.append(inc)
    return found


def sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in SUFFIXES and p.is_file())


def violations(layer: str, root: Path = ROOT) -> list[tuple[str, str]]:
    return [(p.relative_to(root).as_posix(), inc) for p in sources(root / layer) for inc in includes(p, root)
            if inc.startswith(RULES[layer])]


@no_sources
@pytest.mark.parametrize("layer", sorted(RULES))
def test_layer_includes_only_lower_layers(layer):
    assert sources(ROOT / layer), f"no sources under {layer}: the layer map is stale"
    bad = [f"{f} includes {inc}" for f, inc in violations(layer) if (f, inc) not in EXCEPTIONS]
    assert not bad, f"{layer} must not include {RULES[layer]} (docs/architecture.md, 'Layers point down'):\n" + \
        "\n".join(bad)


@no_sources
def test_every_layer_folder_is_on_the_map():
    """A new folder under cpp/ or include/lowbit/ gets a rule (or joins TOP) before it gets code."""
    folders = {p.relative_to(ROOT).as_posix() for base in ("cpp", "include/lowbit") for p in (ROOT / base).iterdir()
               if p.is_dir()}
    assert folders == set(RULES) | set(TOP), f"not on the layer map: {sorted(folders - set(RULES) - set(TOP))}; " \
        f"gone: {sorted(set(RULES) | set(TOP) - folders)}"


@no_sources
def test_exceptions_still_occur():
    seen = {v for layer in RULES for v in violations(layer)}
    assert not set(EXCEPTIONS) - seen, f"exceptions that no longer occur (remove them): {set(EXCEPTIONS) - seen}"


def test_the_rule_catches_an_upward_include(tmp_path):
    """The check itself: quoted, angle and relative includes of a higher layer are reported, and a kernel's
    downward includes (core, quant's layout, a same-folder header, system headers) are not."""
    (tmp_path / "cpp/ops").mkdir(parents=True)
    (tmp_path / "cpp/ops/op_checks.h").write_text("#pragma once\n")
    (tmp_path / "cpp/kernels/cpu").mkdir(parents=True)
    (tmp_path / "cpp/kernels/cpu/near.h").write_text("#pragma once\n")
    (tmp_path / "cpp/kernels/cpu/k.h").write_text(
        '#pragma once\n#include <vector>\n#include <cuda/pipeline>\n#include "lowbit/core/tensor.h"\n'
        '#include "quant/pack_cpu_layout.h"\n#include "near.h"\n'
        '  #  include "lowbit/ops/ops.h"\n#include <lowbit/model/model.h>\n#include "../../ops/op_checks.h"\n')
    assert violations("cpp/kernels", tmp_path) == [
        ("cpp/kernels/cpu/k.h", "lowbit/ops/ops.h"), ("cpp/kernels/cpu/k.h", "lowbit/model/model.h"),
        ("cpp/kernels/cpu/k.h", "ops/op_checks.h")]
