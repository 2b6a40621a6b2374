"""GPU W4A16 decode kernel for Hopper (gemm_w4a16_decode_sm90.cu, "decode90"): 1-16 tokens, TMA-fed, split-K in
clusters. Against float64 on odd shapes, against the sm80 small kernel (the same dequantized f16 weights: only the
f32 accumulation order differs), and under programmatic dependent launch right after the kernel that writes x."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_w4a16 import (check, check_same_weights, gemm_forced_mins, half_chunk_problem, random_w4,
                            reference_weight)

SM90 = lowbit.cuda_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")]


# m: one 8-token tile, its edge, the 16-token tile; n: partial 16-row tiles and partial 128-row CTAs; k: one
# chunk (64), a short last g128 group (576), 65 chunks (4160); g32 and g96 put two groups in one chunk; mins
# (GGUF Q4_1) and zero points. Splits: automatic, 1, and clusters 2 / 8 (some ranks empty when k is short).
@pytest.mark.parametrize("with_mins", [False, True])
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k,group", [(17, 64, 64), (272, 576, 128), (4103, 640, 96), (1000, 4160, 32),
                                       (130, 4160, 128)])
@pytest.mark.parametrize("split", [0, 1, 2, 8])
def test_decode90_matches_float64(with_mins, m, n, k, group, split):
    x, packed, ref, _ = half_chunk_problem(m, n, k, group, with_mins, seed=m + n + k + group + split + with_mins)
    kernel = "decode90" if split == 0 else f"decode90:{split}"
    check(gemm_forced_mins(kernel, x, packed, n, k, group, with_mins), ref)


# The same f16 weights as the small kernel, summed in another order: within check_same_weights' bound.
@pytest.mark.parametrize("with_mins", [False, True])
@pytest.mark.parametrize("m", [1, 7, 16])
@pytest.mark.parametrize("split", [1, 2, 4, 8])
def test_decode90_matches_small_kernel(with_mins, m, split):
    n, k, group = 4103, 4160, 64
    x, packed, ref, ref_abs = half_chunk_problem(m, n, k, group, with_mins, seed=split * 31 + m)
    y_small = gemm_forced_mins("small", x, packed, n, k, group, with_mins, split_k=split)
    y = gemm_forced_mins(f"decode90:{split}", x, packed, n, k, group, with_mins)
    check(y, ref)
    check_same_weights(y, y_small, ref_abs)


def test_decode90_is_the_automatic_choice_for_wide_layers_up_to_16_tokens():
    """Without a kernel or split named the op takes, at one token, the register-direct GEMV on every layer (measured
    faster than decode90 on gate_up, round 4); from 2 to 16 tokens the decode kernel on layers of 16384 rows or more
    (where it was measured faster), on narrower layers the small kernel; the small kernel from 17 tokens or when a
    split is pinned."""
    k, group = 4160, 64
    for m in (1, 16):
        n = 16400  # 129 CTAs of 128 rows, the last one partial
        x, packed, _, _ = half_chunk_problem(m, n, k, group, False, seed=m)
        auto = gemm_forced_mins("", x, packed, n, k, group, False)
        if m == 1:
            assert torch.equal(auto, gemm_forced_mins("gemv", x, packed, n, k, group, False))
        else:
            split = _core.gemm_w4a16_decode_sm90_split(m, n, k)
            assert split in (1, 2, 4, 8) and _core.gemm_w4a16_pick_split(m, n, k) == 1
            assert torch.equal(auto, gemm_forced_mins(f"decode90:{split}", x, packed, n, k, group, False))
        assert torch.equal(gemm_forced_mins("", x, packed, n, k, group, False, split_k=3),
                           gemm_forced_mins("small", x, packed, n, k, group, False, split_k=3))
        n = 4103  # narrow: at one token the register-direct GEMV, else the small kernel
        x, packed, _, _ = half_chunk_problem(m, n, k, group, False, seed=m + 1)
        narrow = "gemv" if m == 1 else "small"
        split = _core.gemm_w4a16_pick_split(m, n, k)
        assert torch.equal(gemm_forced_mins("", x, packed, n, k, group, False),
                           gemm_forced_mins(narrow, x, packed, n, k, group, False, split_k=split if m > 1 else 0))


def test_decode90_picks_clusters_that_cover_the_gpu():
    """gate_up's 224 CTAs cover the SMs unsplit; the 4096/6144-row layers need a cluster of 2-8 to."""
    assert _core.gemm_w4a16_decode_sm90_split(1, 28672, 4096) == 1
    for n, k in [(4096, 4096), (4096, 14336), (6144, 4096)]:
        assert _core.gemm_w4a16_decode_sm90_split(1, n, k) in (2, 4, 8), (n, k)


def test_decode90_strided_x_and_unaligned_y():
    """x rows ldx apart (the bulk copies read each row at its own address); y rows an odd stride apart (scalar
    stores from the staged tile)."""
    m, n, k, group, ldx = 9, 272, 1216, 128, 1288
    q, s, z = random_w4(n, k, group, 4)
    packed = tuple(torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, group))
    x_full = torch.randn(m, ldx, generator=torch.Generator().manual_seed(5)).half()
    ref = x_full[:, :k].double() @ reference_weight(q, s, z, k, group).T
    y_full = torch.full((m, n + 3), float("nan"), dtype=torch.float16, device="cuda")
    y = y_full[:, :n]
    _core.gemm_w4a16(x_full.cuda()[:, :k], *packed, n, k, group, y, kernel="decode90:2")
    torch.cuda.synchronize()
    assert torch.isnan(y_full[:, n:]).all(), "wrote past n"
    check(y.cpu().double(), ref)


def test_decode90_reads_x_after_the_kernel_that_wrote_it():
    """Launched as a programmatic dependent, the kernel's weight copies start early but x must be the value the
    kernel before it wrote: each call follows a copy into the same x buffer, eagerly and in a CUDA graph."""
    m, n, k, group = 4, 4096, 4096, 128
    _, packed, _, _ = half_chunk_problem(m, n, k, group, False, seed=9)
    sources = [torch.randn(m, k, generator=torch.Generator().manual_seed(i)).half().cuda() for i in range(6)]
    x = torch.empty(m, k, dtype=torch.float16, device="cuda")
    ys = [torch.empty(m, n, dtype=torch.float16, device="cuda") for _ in sources]

    def step():
        for src, y in zip(sources, ys):
            x.copy_(src)  # on torch's current stream, which the GEMM joins
            _core.gemm_w4a16(x, *packed, n, k, group, y, stream=torch.cuda.current_stream().cuda_stream,
                             kernel="decode90")

    def expected():
        out = []
        for src in sources:
            y = torch.empty(m, n, dtype=torch.float16, device="cuda")
            _core.gemm_w4a16(src, *packed, n, k, group, y, kernel="decode90")
            out.append(y)
        return out

    want = expected()
    step()
    torch.cuda.synchronize()
    assert all(torch.equal(y, w) for y, w in zip(ys, want))
    for y in ys:
        y.fill_(float("nan"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for y in ys:
        y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(y, w) for y, w in zip(ys, want))


def test_decode90_bad_split_names_the_parameter():
    x, packed, _, _ = half_chunk_problem(1, 32, 128, 64, False, seed=1)
    y = torch.empty(1, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="decode90:S.*1, 2, 4 or 8.*decode90:3"):
        _core.gemm_w4a16(x.cuda(), *packed, 32, 128, 64, y, kernel="decode90:3")


# ---- end to end: a model whose gate_up is wide enough (2 x 8192 rows) for the registry to pick the kernel ----
@pytest.mark.parametrize("recipe", ["w4a16kv8", "w4a16g32kv8"])
def test_engine_decodes_gate_up_on_decode90(recipe):
    """The plan names the decode kernel for gate_up from 2 to 16 tokens (the register-direct GEMV for every layer at
    one token, the small kernel for the narrow layers);
    greedy decoding with CUDA graphs then stays on the CPU engine's argmax (0.1 logits: the f16 drift, while a wrong
    row or token costs whole logits)."""
    from test_gpu_engine import greedy_margin_violations, random_llama, run_greedy
    cpu = random_llama(recipe, "cpu", "f32", seed=7, inter=8192)
    gpu = random_llama(recipe, "cuda", "f16", seed=7, inter=8192)
    kernels = {p["role"]: p["kernel"] for p in gpu.plan() if p["role"].startswith("linear.")}
    assert any(role.startswith("linear.gate_up ") for role in kernels), kernels
    for role, kernel in kernels.items():
        if role.endswith(" m1"):
            assert kernel == "gemm_w4a16_gemv_sm80", role
            continue
        decode_bucket = role.endswith((" m2-4", " m5-16"))
        assert (kernel == "gemm_w4a16_decode_sm90") == (role.startswith("linear.gate_up ") and decode_bucket), role
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (1, 5, 16, 40)]
    gpu_tokens = run_greedy(_core.Engine(gpu, max_batch_tokens=64, cuda_graphs=True), prompts, 16)
    assert all(len(t) == 16 for t in gpu_tokens)
    assert greedy_margin_violations(_core.Engine(cpu), prompts, gpu_tokens, 0.1) == []
