"""Layers only point down: the C++ sources' #include lines keep the map of docs/architecture.md.

From the bottom: core (tensors, devices, and the small parameter types every layer shares: RopeConfig,
SamplingParams) -> quant (formats, packers and their layouts) and kv (the paged cache, AttentionMeta) -> kernels
(CPU and GPU code, their descriptors and registries) -> ops (argument checks, plans) -> model -> engine. A lower
layer that includes a higher one makes the two one component (a kernel change rebuilds and retests the ops; a
type has two homes). Reads the sources, so it skips where the tests run without them."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# layer folder (relative to the repository) -> include prefixes it must not use
HIGHER = ("lowbit/ops/", "ops/", "lowbit/model/", "model/", "lowbit/engine/", "engine/")
RULES = {
    # The shared types live in core; core includes nothing of lowbit above it.
    "include/lowbit/core": HIGHER + ("lowbit/kernels/", "kernels/", "lowbit/quant/", "quant/", "lowbit/kv/"),
    "cpp/core": HIGHER + ("lowbit/kernels/", "kernels/", "lowbit/kv/", "kv/"),
    # Formats and packers: below every kernel (the CPU layout header is quant's, the kernels read it).
    "include/lowbit/quant": HIGHER + ("lowbit/kernels/", "kernels/"),
    "cpp/quant": HIGHER + ("lowbit/kernels/", "kernels/"),
    # The paged KV cache and the attention metadata: below the kernels that read them.
    "include/lowbit/kv": HIGHER + ("lowbit/kernels/", "kernels/"),
    "cpp/kv": HIGHER,
    # Kernels, their descriptors and registries: below the ops that check arguments and run plans.
    "include/lowbit/kernels": HIGHER,
    "cpp/kernels": HIGHER,
}


def includes(path):
    return INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace"))


@pytest.mark.skipif(not (ROOT / "cpp").is_dir(), reason="the C++ sources are not next to the tests")
@pytest.mark.parametrize("layer", sorted(RULES))
def test_layer_includes_only_lower_layers(layer):
    files = [p for p in (ROOT / layer).rglob("*") if p.suffix in (".h", ".cuh", ".cpp", ".cu")]
    assert files, f"no sources under {layer}: the layer map is stale"
    bad = [f"{p.relative_to(ROOT)} includes {inc}" for p in files for inc in includes(p)
           if inc.startswith(RULES[layer])]
    assert not bad, f"{layer} must not include {RULES[layer]}:\n" + "\n".join(bad)


def test_the_rule_catches_an_upward_include(tmp_path):
    """The check itself: a file that includes ops.h is reported."""
    src = tmp_path / "k.h"
    src.write_text('#pragma once\n#include "lowbit/core/tensor.h"\n  #  include "lowbit/ops/ops.h"\n')
    assert [i for i in includes(src) if i.startswith(RULES["cpp/kernels"])] == ["lowbit/ops/ops.h"]
