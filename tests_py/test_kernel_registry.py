"""Kernel registries and execution plans from Python: `_core.kernels` lookups (which kernel a descriptor gets, the
miss that lists every candidate's reason, forced and strict errors), `lowbit.LLM(kernel_overrides=..., strict=...)`,
`Model.plan()` and `lowbit info --plan`. The GPU descriptors are answered by plain C++, so they are checked here on
any machine; the GPU plan of a real model is checked where a GPU is present."""
import subprocess
import sys

import pytest
import torch

import lowbit
from lowbit import _core
from test_llm import tiny_tensors
from test_models_loader import _tiny_config, make_gguf


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    config = _tiny_config()
    return make_gguf(tmp_path_factory.mktemp("tiny_registry") / "tiny.gguf", config, tiny_tensors(config))


def test_every_kernel_is_listed_once():
    names = [k["name"] for k in _core.kernels.gemm_kernels() + _core.kernels.attention_kernels()]
    assert len(names) == len(set(names))
    assert {"gemm_f32act_cpu", "gemm_w4a16_sm80", "gemm_w8a8_sm90", "decode_attention_sm80",
            "paged_attention_cpu"} <= set(names)
    cpu = {k["name"]: k["built"] for k in _core.kernels.gemm_kernels()}
    assert cpu["gemm_f32act_cpu"]  # CPU kernels are in every build


# W4A16: the GEMV at one token on sm_90, the small mma.sync kernel to 16 tokens, the wgmma kernel from 17 (small tiles,
# stream-K, then the 128 / 256-token plans); the small / large mma.sync kernels on other GPUs.
@pytest.mark.parametrize("sm,m,expected", [(90, 1, "gemm_w4a16_gemv_sm80"), (90, 16, "gemm_w4a16_sm80"),
                                           (90, 17, "gemm_w4a16_sm90"), (90, 100, "gemm_w4a16_sm90"),
                                           (80, 100, "gemm_w4a16_sm80"),
                                           (90, 128, "gemm_w4a16_sm90"),
                                           (90, 4096, "gemm_w4a16_sm90"), (80, 128, "gemm_w4a16_large_sm80"),
                                           (89, 4096, "gemm_w4a16_large_sm80"), (80, 1, "gemm_w4a16_sm80")])
def test_w4a16_kernel_by_token_bucket(sm, m, expected):
    r = _core.kernels.select_gemm(device="cuda", sm=sm, act="float16", x="f16", y="f16", weight="w4", packed="sm80",
                                  group=128, n=4096, k=4096, m=m)
    assert r["kernel"] == expected and not r["fallback"], r


@pytest.mark.parametrize("sm,m,n,expected", [(90, 1, 28672, "gemm_w4a16_gemv_sm80"),
                                             (90, 2, 28672, "gemm_w4a16_decode_sm90"), (90, 16, 16384, "gemm_w4a16_decode_sm90"),
                                             (90, 16, 16383, "gemm_w4a16_sm80"), (90, 17, 28672, "gemm_w4a16_sm90"),
                                             (90, 128, 28672, "gemm_w4a16_sm90"), (89, 1, 28672, "gemm_w4a16_sm80")])
def test_w4a16_decode_kernel_on_wide_layers(sm, m, n, expected):
    r = _core.kernels.select_gemm(device="cuda", sm=sm, act="float16", x="f16", y="f16", weight="w4", packed="sm80",
                                  group=128, n=n, k=4096, m=m)
    assert r["kernel"] == expected and not r["fallback"], r


# One token on sm_90: the register-direct GEMV on every layer of k <= 32768 (measured faster than the small kernel and
# decode90 on every Llama-3-8B and 70B/TP2 layer, round 4); the small kernel past that k, elsewhere and from 2 tokens.
@pytest.mark.parametrize("sm,m,n,k,expected", [(90, 1, 6144, 4096, "gemm_w4a16_gemv_sm80"),
                                               (90, 1, 4096, 4096, "gemm_w4a16_gemv_sm80"),
                                               (90, 1, 8192, 4096, "gemm_w4a16_gemv_sm80"),
                                               (90, 1, 4096, 14336, "gemm_w4a16_gemv_sm80"),
                                               (90, 1, 4096, 32832, "gemm_w4a16_sm80"),
                                               (90, 2, 4096, 4096, "gemm_w4a16_sm80"),
                                               (80, 1, 4096, 4096, "gemm_w4a16_sm80"),
                                               (90, 1, 16384, 1024, "gemm_w4a16_gemv_sm80"),
                                               (90, 1, 28672, 8192, "gemm_w4a16_gemv_sm80")])
def test_w4a16_gemv_at_one_token(sm, m, n, k, expected):
    r = _core.kernels.select_gemm(device="cuda", sm=sm, act="float16", x="f16", y="f16", weight="w4", packed="sm80",
                                  group=128, n=n, k=k, m=m)
    assert r["kernel"] == expected and not r["fallback"], r


# W4A8 (QoQ, LiquidQuant): on sm_90 the register-direct GEMV at 1-4 tokens, the wgmma kernel from 17 tokens (its 32 /
# 64-token tiles to 64, then stream-K and the 128 / 256-token plans) and at 5-16 tokens on layers of 16384 rows or more
# (n below; the n = 4096 rows of test_w4a8_gemv_at_one_token keep mma.sync there); the mma.sync kernel on other GPUs.
@pytest.mark.parametrize("sm,m,weight,group,expected", [(90, 1, "qoq", 128, "gemm_w4a8_gemv_sm80"),
                                                        (90, 1, "liquid", 64, "gemm_w4a8_gemv_sm80"),
                                                        (90, 2, "qoq", 128, "gemm_w4a8_gemv_sm80"),
                                                        (90, 4, "liquid", 64, "gemm_w4a8_gemv_sm80"),
                                                        (90, 5, "qoq", 128, "gemm_w4a8_sm80"),
                                                        (90, 16, "liquid", 64, "gemm_w4a8_sm80"),
                                                        (90, 17, "qoq", 128, "gemm_w4a8_sm90"),
                                                        (90, 127, "liquid", 64, "gemm_w4a8_sm90"),
                                                        (80, 16, "qoq", 128, "gemm_w4a8_sm80"),
                                                        (80, 3, "qoq", 128, "gemm_w4a8_sm80"),
                                                        (90, 128, "liquid", 64, "gemm_w4a8_sm90"),
                                                        (80, 1, "qoq", 128, "gemm_w4a8_sm80"),
                                                        (89, 1, "liquid", 64, "gemm_w4a8_sm80")])
def test_w4a8_gemv_at_one_token(sm, m, weight, group, expected):
    for x in ("f16", "s8"):
        r = _core.kernels.select_gemm(device="cuda", sm=sm, act="int8_per_token", x=x, y="f16", weight=weight,
                                      packed="sm80", group=group, n=4096, k=14336, m=m)
        assert r["kernel"] == expected and not r["fallback"], r


@pytest.mark.parametrize("sm,m,n,expected", [(90, 5, 16384, "gemm_w4a8_sm90"), (90, 16, 28672, "gemm_w4a8_sm90"),
                                             (90, 16, 16383, "gemm_w4a8_sm80"), (90, 4, 28672, "gemm_w4a8_gemv_sm80"),
                                             (80, 16, 28672, "gemm_w4a8_sm80")])
def test_w4a8_wide_layers_take_the_wgmma_kernel_from_five_tokens(sm, m, n, expected):
    r = _core.kernels.select_gemm(device="cuda", sm=sm, act="int8_per_token", x="f16", y="f16", weight="qoq",
                                  packed="sm80", group=128, n=n, k=4096, m=m)
    assert r["kernel"] == expected and not r["fallback"], r


# The f16 GEMM: cuBLASLt at every token count in a build that has it (the descriptor says so); without it the GEMV at
# one token and the mma.sync kernel from two, with the missing library named among the candidates' reasons.
@pytest.mark.parametrize("m", [1, 2, 16, 17, 4096])
def test_f16_gemm_on_cublaslt_and_without_it(m):
    args = dict(device="cuda", sm=90, act="float16", x="f16", y="f16", weight="f16", packed="sm80", n=4096, k=4096, m=m)
    assert _core.kernels.select_gemm(**args)["kernel"] == "gemm_f16_cublaslt"
    r = _core.kernels.select_gemm(**args, cublaslt=False)
    assert r["kernel"] == ("gemm_f16_gemv_sm80" if m == 1 else "gemm_f16_mma_sm80") and not r["fallback"], r
    assert "gemm_f16_cublaslt: this lowbit build has no cuBLASLt" in r["reasons"], r["reasons"]
    with pytest.raises(NotImplementedError, match="forced kernel gemm_f16_cublaslt cannot run.*no cuBLASLt"):
        _core.kernels.select_gemm(**args, cublaslt=False, forced="gemm_f16_cublaslt")
    w4 = _core.kernels.select_gemm(**{**args, "weight": "w4", "group": 128})
    assert w4["kernel"] not in (None, "gemm_f16_cublaslt"), w4


def test_decode_attention_kernel_and_named_fallbacks():
    ok = _core.kernels.select_attention(device="cuda", sm=90, phase="decode", head_dim=64, q="f16", k="u8", v="u4",
                                        gqa=3)
    assert ok["kernel"] == "decode_attention_sm80" and not ok["fallback"]
    slow = _core.kernels.select_attention(device="cuda", sm=90, phase="decode", head_dim=72, q="f16", k="f16",
                                          v="f16")
    assert slow["kernel"] == "prefill_attention_sm80" and slow["fallback"]
    assert "head_dim 64, 80, 96, 128, 256, not 72" in slow["why"]


@pytest.mark.parametrize("head_dim,gqa", [(64, 16), (128, 12), (256, 1), (256, 16), (128, 9), (80, 16), (96, 12),
                                         (80, 1), (96, 8)])
@pytest.mark.parametrize("sm", [80, 90])
def test_decode_kernel_serves_every_head_dim_and_gqa_up_to_16(head_dim, gqa, sm):
    """64/128/256 decode on tensor cores in every build; 80/96 where LOWBIT_ATTN_ALL_INSTANCES=ON built them,
    and otherwise no kernel at all (an error naming the option), never the slow fallback."""
    rare = head_dim in (80, 96)
    for k, v in (("f16", "f16"), ("u8", "u8"), ("u4", "u4"), ("u8", "u4"), ("u4", "f16"), ("f16", "u8")):
        r = _core.kernels.select_attention(device="cuda", sm=sm, phase="decode", head_dim=head_dim, q="f16", k=k, v=v,
                                           gqa=gqa)
        if r["kernel"] is None and rare:
            assert f"the instance for head_dim {head_dim} k={k} v={v} is not built (configure with " \
                   "-DLOWBIT_ATTN_ALL_INSTANCES=ON)" in r["reasons"], r
            with pytest.raises(NotImplementedError, match="LOWBIT_ATTN_ALL_INSTANCES=ON"):
                _core.kernels.select_attention(device="cuda", sm=sm, phase="decode", head_dim=head_dim, q="f16", k=k,
                                               v=v, gqa=gqa, strict=True)
        else:
            assert r["kernel"] == "decode_attention_sm80" and not r["fallback"], r


def test_decode_past_its_instances_is_a_named_fallback():
    over = _core.kernels.select_attention(device="cuda", sm=90, phase="decode", head_dim=128, q="f16", k="u8", v="u8",
                                          gqa=17)
    assert over["fallback"] and "GQA groups up to 16" in over["why"]
    # Prefill on tensor cores has head_dim 64 and 128; 256 takes the warp-per-query kernel, named as such.
    pre = _core.kernels.select_attention(device="cuda", sm=90, phase="prefill", head_dim=256, q="f16", k="f16",
                                         v="f16")
    assert pre["kernel"] == "prefill_attention_sm80" and pre["fallback"]
    assert "head_dim 64, 128, not 256" in pre["why"]


def test_miss_lists_every_candidate():
    r = _core.kernels.select_gemm(device="cuda", sm=90, act="int8_per_token", x="f16", y="f16", weight="w4",
                                  packed="sm80", group=128, n=4096, k=4096)
    assert r["kernel"] is None
    assert "gemm_w4a16_sm80: float activations only" in r["reasons"]
    assert "gemm_w8a8_sm90: needs w8 weights, got w4" in r["reasons"]


def test_forced_kernel_that_cannot_run_raises_with_the_reason():
    with pytest.raises(NotImplementedError, match="forced kernel gemm_w8a8_sm90 cannot run .*need sm_90"):
        _core.kernels.select_gemm(device="cuda", sm=80, act="int8_per_token", x="f16", y="f16", weight="w8",
                                  packed="sm80", forced="gemm_w8a8_sm90")
    with pytest.raises(NotImplementedError, match="strict: .* would take the slow fallback prefill_attention_sm80"):
        _core.kernels.select_attention(device="cuda", sm=90, phase="decode", head_dim=72, q="f16", k="f16", v="f16",
                                       strict=True)


def test_llm_plan_names_the_kernels(tiny_path):
    llm = lowbit.LLM(str(tiny_path), progress=False)
    plan = llm.model.plan()
    roles = {p["role"]: p["kernel"] for p in plan}
    assert roles["linear.qkv m1"] == "gemm_f32act_cpu"
    assert roles["attention.decode"] == roles["attention.prefill"] == "paged_attention_cpu"
    assert not any(p["fallback"] for p in plan)
    info = llm.info()
    assert any("gemm_f32act_cpu" in k for k in info["kernels"]) and info["plan"] == plan


def test_llm_kernel_overrides_and_strict(tiny_path):
    with pytest.raises(NotImplementedError, match="linear.down: forced kernel gemm_s8act_cpu cannot run"):
        lowbit.LLM(str(tiny_path), progress=False, kernel_overrides={"linear.down": "gemm_s8act_cpu"})
    with pytest.raises(ValueError, match="unknown key 'lienar'"):
        lowbit.LLM(str(tiny_path), progress=False, kernel_overrides={"lienar": "gemm_f32act_cpu"})
    with pytest.raises(ValueError, match="'gemm_nope' is not registered"):
        lowbit.LLM(str(tiny_path), progress=False, kernel_overrides={"linear": "gemm_nope"})
    llm = lowbit.LLM(str(tiny_path), recipe="w8a8", progress=False, strict=True,
                     kernel_overrides={"linear.lm_head": "gemm_f32act_cpu", "attention": "paged_attention_cpu"})
    kernels = {p["role"].split(" ")[0]: p["kernel"] for p in llm.model.plan()}
    assert kernels["linear.qkv"] == "gemm_s8act_cpu" and kernels["linear.lm_head"] == "gemm_f32act_cpu"
    out = llm.generate("hi", lowbit.GenerationConfig(max_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3
    # One token bucket of a role: only that bucket's plan line is forced; one that cannot run there is an error.
    llm = lowbit.LLM(str(tiny_path), recipe="w8a8", progress=False, kernel_overrides={"linear.o@m2-4": "gemm_s8act_cpu"})
    why = {p["role"]: p["why"] for p in llm.model.plan()}
    assert why["linear.o m2-4"].startswith("forced"), why
    assert not any(w.startswith("forced") for r, w in why.items() if r != "linear.o m2-4"), why
    with pytest.raises(NotImplementedError, match="linear.o: forced kernel gemm_s8act_cpu cannot run"):
        lowbit.LLM(str(tiny_path), progress=False, kernel_overrides={"linear.o@m5-16": "gemm_s8act_cpu"})
    with pytest.raises(ValueError, match="unknown token bucket 'm3'"):
        lowbit.LLM(str(tiny_path), progress=False, kernel_overrides={"linear@m3": "gemm_f32act_cpu"})


def test_cli_info_plan(tiny_path):
    r = subprocess.run([sys.executable, "-m", "lowbit", "info", "--model", str(tiny_path), "--quiet", "--plan"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "plan" in r.stdout and "linear.qkv m1" in r.stdout and "paged_attention_cpu" in r.stdout
    assert "why: best ranked fit" in r.stdout


@pytest.mark.skipif(not _core.cuda_available(), reason="needs a CUDA device")
def test_gpu_plan_of_a_decoder(tiny_path):
    llm = lowbit.LLM(str(tiny_path), recipe="w16a16", device="cuda", progress=False)
    roles = {p["role"]: p for p in llm.model.plan()}
    assert roles["linear.qkv m1"]["kernel"] == "gemm_f16_gemv_sm80"
    assert roles["attention.decode"]["kernel"] in ("decode_attention_sm80", "prefill_attention_tc_sm80",
                                                   "prefill_attention_sm80")
    # A decode kernel that cannot serve this model's shape is a named fallback, never silent.
    assert roles["attention.decode"]["fallback"] == (roles["attention.decode"]["kernel"] != "decode_attention_sm80")


def test_paged_attention_forced_kernel_on_the_cpu():
    """paged_attention(kernel=...) runs the named kernel or says why not: the CPU kernel by name gives the
    automatic result bit for bit; a GPU kernel named for CPU tensors is refused with its reason."""
    g = torch.Generator().manual_seed(0)
    cache = _core.KVCache(1, 2, 64, 4, 16, "f32", "f32", "cpu")
    k, v = torch.randn(20, 2, 64, generator=g), torch.randn(20, 2, 64, generator=g)
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    slots = torch.tensor([32 + i if i < 16 else i - 16 for i in range(20)], dtype=torch.int32)
    _core.kv_write(cache, 0, k, v, _core.AttentionMeta([0], [20], [20], table, slots))
    q = torch.randn(20, 8, 64, generator=g)
    meta = _core.AttentionMeta([0], [20], [20], table, slots)
    auto = torch.from_dlpack(_core.paged_attention(q, cache, 0, meta, 0.125)).clone()
    named = torch.from_dlpack(_core.paged_attention(q, cache, 0, meta, 0.125, kernel="paged_attention_cpu"))
    assert not torch.isnan(auto).any() and torch.equal(auto, named)
    with pytest.raises(NotImplementedError, match="forced kernel decode_attention_sm80 cannot run"):
        _core.paged_attention(q, cache, 0, meta, 0.125, kernel="decode_attention_sm80")
    with pytest.raises(ValueError, match="forced kernel 'flash' is not registered"):
        _core.paged_attention(q, cache, 0, meta, 0.125, kernel="flash")
    # Tuning options pass through (the CPU kernel has none of these knobs: same result); bad ones name the problem.
    tuned = torch.from_dlpack(_core.paged_attention(q, cache, 0, meta, 0.125,
                                                    options={"prefill_key_split": "4", "prefill_pack_heads": "on"}))
    assert torch.equal(auto, tuned)
    with pytest.raises(ValueError, match="prefill_key_split'] must be auto, off or a split count from 2 to 16"):
        _core.paged_attention(q, cache, 0, meta, 0.125, options={"prefill_key_split": "99"})
    with pytest.raises(ValueError, match="options take kernel tuning keys only"):
        _core.paged_attention(q, cache, 0, meta, 0.125, options={"attention": "paged_attention_cpu"})


def test_fmpq_gpu_kernel_and_its_refusals():
    """COMET W4Ax on the GPU: FMPQ s8 codes x qoq/liquid weights take gemm_fmpq_s4_sm80 (int4 tensor cores) on
    sm_80/86/87/89, on sm_90 gemm_fmpq_gemv_sm80 at 1-4 tokens (down-like layers only at one), gemm_fmpq_sm80 from
    5 and gemm_fmpq_sm90 from 128 on; w8 weights and f16 rows (no block map) are refused by name."""
    down = _core.kernels.select_gemm(device="cuda", sm=90, act="fmpq_mixed", x="s8", y="f16", weight="liquid",
                                     packed="sm80", group=64, n=4096, k=14336, m=3)  # down-like at 2-4 tokens
    assert down["kernel"] == "gemm_fmpq_sm80", down
    for sm, m, expected in ((80, 1, "gemm_fmpq_s4_sm80"), (80, 4096, "gemm_fmpq_s4_sm80"),
                            (86, 16, "gemm_fmpq_s4_sm80"), (89, 4096, "gemm_fmpq_s4_sm80"), (89, 3, "gemm_fmpq_s4_sm80"),
                            (87, 100, "gemm_fmpq_s4_sm80"), (90, 1, "gemm_fmpq_gemv_sm80"),
                            (90, 4, "gemm_fmpq_gemv_sm80"), (90, 5, "gemm_fmpq_sm80"), (90, 16, "gemm_fmpq_sm80"),
                            (90, 100, "gemm_fmpq_sm80"), (90, 4096, "gemm_fmpq_sm90")):
        r = _core.kernels.select_gemm(device="cuda", sm=sm, act="fmpq_mixed", x="s8", y="f16", weight="liquid",
                                      packed="sm80", group=64, n=4096, k=4096, m=m)
        assert r["kernel"] == expected and not r["fallback"], r
    w8 = _core.kernels.select_gemm(device="cuda", sm=90, act="fmpq_mixed", x="s8", y="f16", weight="w8",
                                   packed="sm80", n=4096, k=4096)
    assert w8["kernel"] is None and "gemm_fmpq_sm80: needs qoq or liquid weights, got w8" in w8["reasons"]
    rows = _core.kernels.select_gemm(device="cuda", sm=90, act="fmpq_mixed", x="f16", y="f16", weight="qoq",
                                     packed="sm80", group=128, n=4096, k=4096)
    assert rows["kernel"] is None and "gemm_fmpq_sm80: takes s8 codes" in rows["reasons"]


@pytest.mark.parametrize("sm,m", [(90, 1), (90, 100), (90, 4096), (80, 16)])
def test_fmpq_s4_kernel_is_forcible_by_name_everywhere_it_can_run(sm, m):
    """On sm_90 (no int4 tensor cores) the s4 kernel is never the automatic choice, but forcing it by name works and
    says so; its reasons name the slow path."""
    r = _core.kernels.select_gemm(device="cuda", sm=sm, act="fmpq_mixed", x="s8", y="f16", weight="qoq",
                                  packed="sm80", group=128, n=4096, k=4096, m=m, forced="gemm_fmpq_s4_sm80")
    assert r["kernel"] == "gemm_fmpq_s4_sm80" and r["why"].startswith("forced") and not r["fallback"], r
    assert ("slow on sm_90" in r["why"]) == (sm == 90), r
    w8 = _core.kernels.select_gemm(device="cuda", sm=sm, act="fmpq_mixed", x="s8", y="f16", weight="w8",
                                   packed="sm80", n=4096, k=4096)
    assert "gemm_fmpq_s4_sm80: needs qoq or liquid weights, got w8" in w8["reasons"]
