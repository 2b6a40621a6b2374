"""The f16 GEMM on cuBLASLt (cpp/kernels/cublaslt/, registry entry gemm_f16_cublaslt) end to end: the plan puts it
on every f16 linear at every token count (w16a16's layers, every recipe's lm_head), CUDA-graph decoding through it
stays on the CPU engine's argmax, and the cached per-shape plans do not leak into other shapes. Its numerics on odd
shapes, strides, tails and bias are in test_gpu_f16_gemm.py (forced like every f16 kernel)."""
import pytest
import torch

import lowbit
from lowbit import _core
from lowbit.info import cuda_libraries

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

needs_cublaslt = pytest.mark.skipif(not lowbit.cuda_available() or not cuda_libraries()["cublaslt"],
                                    reason="this build has no cuBLASLt")


def linear_plan(model):
    return {p["role"]: p["kernel"] for p in model.plan() if p["role"].startswith("linear.")}


@needs_cublaslt
@pytest.mark.parametrize("recipe", ["w16a16", "w4a8kv4"])
def test_plan_takes_cublaslt_for_every_f16_linear(recipe):
    """w16a16: every linear in every token bucket; w4a8kv4: the lm_head only (its layers are W4A8)."""
    from test_gpu_engine import random_llama
    plan = linear_plan(random_llama(recipe, "cuda", "f16", seed=3))
    heads = {role for role in plan if role.startswith("linear.lm_head ")}
    assert len(heads) == 5, plan
    for role, kernel in plan.items():
        assert (kernel == "gemm_f16_cublaslt") == (recipe == "w16a16" or role in heads), (role, kernel)


@needs_cublaslt
def test_w16a16_graph_decoding_through_cublaslt_follows_the_cpu_engine():
    """24 sequences decode together (the m17-127 bucket) down to the last one (m1), every linear and the lm_head on
    cuBLASLt, with CUDA graphs;
    greedy tokens stay on the CPU engine's argmax within 0.1 logits (the f16 drift; a wrong row or token costs whole
    logits), and eager decoding gives the same tokens as the graphs."""
    from test_gpu_engine import greedy_margin_violations, random_llama, run_greedy
    cpu = random_llama("w16a16", "cpu", "f32", seed=11)
    gpu = random_llama("w16a16", "cuda", "f16", seed=11)
    g = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, 1000, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 60, (24,), generator=g)]
    graphs = run_greedy(_core.Engine(gpu, max_batch_tokens=512, cuda_graphs=True), prompts, 12)
    eager = run_greedy(_core.Engine(gpu, max_batch_tokens=512, cuda_graphs=False), prompts, 12)
    assert all(len(t) == 12 for t in graphs)
    assert graphs == eager
    assert greedy_margin_violations(_core.Engine(cpu), prompts, graphs, 0.1) == []


@needs_cublaslt
def test_cublaslt_plans_follow_shape_stride_and_alignment():
    """One weight, x of 40 rows: contiguous, with a wider row stride, and starting 2 bytes past an aligned address
    (a plan made for 256-byte aligned pointers must not be reused for it); each against float64."""
    from lowbit import _core as lb
    n, k = 520, 264
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(n, k, generator=g) * 0.05)
    packed = lb.pack_weight(lb.quantize_weight(w, "f16", 128), "sm80", "cuda")
    w64 = w.half().double().cuda()
    base = torch.randn(41 * (k + 8) + 1, generator=g).half().cuda()
    views = {"contiguous": base[: 40 * k].view(40, k),
             "strided": base[: 40 * (k + 8)].view(40, k + 8)[:, :k],
             "misaligned": base[1: 1 + 40 * (k + 8)].view(40, k + 8)[:, :k]}
    for what, x in views.items():
        y = torch.full((40, n), float("nan"), dtype=torch.float16, device="cuda")
        lb.linear(x, packed, None, y, kernel="gemm_f16_cublaslt")
        torch.cuda.synchronize()
        ref = x.double() @ w64.T
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < 2e-3, (what, err)
