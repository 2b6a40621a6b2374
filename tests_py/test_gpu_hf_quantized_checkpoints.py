"""HF quantized checkpoints on the GPU: AWQ, GPTQ (v1 sym, v2 asym) and compressed-tensors int4 directories run on
CUDA with the logits of the same directory on the CPU (which test_hf_quantized_checkpoints.py checks against a
float64 transformers model), act-order GPTQ (desc_act: the input channels are gathered by ops.gather_columns)
included."""
import sys
from pathlib import Path

import numpy as np
import pytest

import lowbit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_quant_checkpoints as ck  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]
IDS = [5, 77, 140, 3, 251, 99, 18, 200, 64, 1, 33, 180]

WRITERS = {
    "awq_g128": lambda p: ck.write_awq(p),
    "gptq_v1_sym_g128": lambda p: ck.write_gptq(p, sym=True, fmt="gptq"),
    "gptq_v2_asym_g128": lambda p: ck.write_gptq(p, sym=False, fmt="gptq_v2"),
    "gptq_v1_sym_g128_act_order": lambda p: ck.write_gptq(p, sym=True, desc_act=True),
    "gptq_v2_asym_g128_act_order": lambda p: ck.write_gptq(p, sym=False, fmt="gptq_v2", desc_act=True),
    "ct_w4_asym_g64": lambda p: ck.write_ct(p, "w4_group_asym"),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_gpu_logits_match_the_cpu(tmp_path, name):
    path, _, _ = WRITERS[name](tmp_path / name)
    ref = lowbit.LLM(str(path), dtype="f32", progress=False).logits(IDS).astype(np.float64)
    got = lowbit.LLM(str(path), device="cuda", progress=False).logits(IDS).astype(np.float64)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(name, "relative logit error vs the CPU:", err)
    # f16 activations through two layers vs f32 (test_gpu_engine.py sees ~1e-3); a wrong layout costs O(1).
    assert err < 2e-2

