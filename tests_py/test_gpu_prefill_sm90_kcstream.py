"""The Hopper prefill kernel over per-channel K with the dequantized copy of the sealed keys
(test_gpu_prefill_sm90_kccopy.py), its per-channel split on a second stream (kernel option prefill_side_stream): the
tail launch forked onto a side stream with an event, beside the copy and the f16 split on the caller's stream, and
joined back (a second event) before the merge. The same kernels read the same data and each writes its own split's
partials, so the output has the same bits with the side stream on and off (NaN-poisoned rows outside the sequences
included); and it matches the float64 reference (per_channel_ref.py) at odd lengths. Also: inside a CUDA graph
(captured on a torch stream, replayed twice over different queries in the same buffer), on a non-default stream with
calls queued back to back (each call's buffers are the previous call's freed blocks), through the launch's own rule,
and on each of two GPUs."""
import pytest
import torch

from lowbit import _core as lb
from per_channel_ref import per_channel_case
from test_gpu_ops import SM90_ONLY, TC_ATOL_SCALE, close
from test_gpu_prefill_sm90_kccopy import IDS, SHAPES, lens

pytestmark = SM90_ONLY
KERNEL = "prefill_attention_sm90"
SIDE = {"prefill_dequant_copy": "on", "prefill_side_stream": "on"}
ONE = {"prefill_dequant_copy": "on", "prefill_side_stream": "off"}


def same_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def attention(q, cache, meta, scale, out, options, stream=0):
    lb.paged_attention(q, cache, 0, meta, scale, out, kernel=KERNEL, options=options, stream=stream)


def case(shape, seed, run, prefix=None, chunk=None, device="cuda"):
    kt, vt, d, bs, hq, hkv = shape
    p, c = lens(bs) if prefix is None else (prefix, chunk)
    out, ref, inside = per_channel_case(p, c, hq, hkv, d, kt, vt, bs, seed, device, run=run)
    assert torch.isnan(out[~inside]).all(), "a row outside every sequence was written"
    close(out[inside], ref[inside], "f16", atol_scale=TC_ATOL_SCALE)


def side_and_one(found, side=SIDE, one=ONE):
    """A run: the call with the side stream and without, each into a NaN-poisoned copy of out; out gets the first."""
    def run(q, cache, meta, scale, out):
        for name, opts in (("side", side), ("one", one)):
            o = out.clone()
            attention(q, cache, meta, scale, o, opts)
            found[name] = o
        out.copy_(found["side"])
    return run


@pytest.mark.parametrize("splits", ["auto", "4"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_side_stream_same_bits_and_float64(shape, splits):
    found = {}
    split = {"prefill_key_split": splits}
    case(shape, shape[4] * 7 + shape[2] + shape[3], side_and_one(found, {**SIDE, **split}, {**ONE, **split}))
    assert same_bits(found["side"], found["one"])


@pytest.mark.parametrize("kv", [("u4", "u4"), ("u2", "u2")], ids=lambda k: "-".join(k))
def test_side_stream_through_the_rule(kv):
    # Llama-3-8B heads: a 256-token chunk over 1500 cached keys (the rule takes the copy, and with it the side
    # stream) beside a 19-token chunk over 300; the default options against the side stream off.
    found = {}
    case((*kv, 128, 64, 32, 8), 13, side_and_one(found, {}, {"prefill_side_stream": "off"}), [1500, 300], [256, 19])
    assert same_bits(found["side"], found["one"])


def device_seq_info(meta, device="cuda"):
    return torch.tensor([meta.q_start, meta.q_len, meta.kv_len], dtype=torch.int32, device=device)


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2]], ids=[IDS[0], IDS[2]])
def test_side_stream_in_a_cuda_graph(shape):
    """Captured on a torch stream (relaxed mode, as the engine's own graphs: launches set their shared-memory limit),
    replayed; then new queries written into the captured q and replayed again. Each replay against the eager
    one-stream call on the same queries, bit for bit; the first against float64."""
    found = {}

    def run(q, cache, meta, scale, out):
        meta.seq_info = device_seq_info(meta)  # no upload inside the call: capturable
        s = torch.cuda.Stream()
        eager, graphed = out.clone(), out.clone()
        attention(q, cache, meta, scale, eager, ONE)
        s.wait_stream(torch.cuda.current_stream())
        attention(q, cache, meta, scale, graphed, SIDE, stream=s.cuda_stream)  # warm-up: side stream, buffers
        s.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s, capture_error_mode="relaxed"):
            attention(q, cache, meta, scale, graphed, SIDE, stream=s.cuda_stream)
        graphed.copy_(out)  # poisoned again: the replay writes it
        graph.replay()
        torch.cuda.synchronize()
        found["first"] = same_bits(graphed, eager)
        out.copy_(graphed)
        q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).half().to(q.device))
        eager2 = out.clone().fill_(float("nan"))
        attention(q, cache, meta, scale, eager2, ONE)
        graph.replay()
        torch.cuda.synchronize()
        found["second"] = same_bits(graphed, eager2) and not same_bits(graphed, eager)

    case(shape, 31 + shape[2], run)
    assert found["first"] and found["second"], found


def test_side_stream_on_a_torch_stream_back_to_back():
    """Four calls over different queries queued on one torch stream without a sync: each call's copy and partials are
    the blocks the previous call freed on the host (the caching allocator), which its tail, forked after the previous
    merge, may reuse only then. Each output against the one-stream call on the default stream, bit for bit."""
    found = {}

    def run(q, cache, meta, scale, out):
        g = torch.Generator().manual_seed(9)
        qs = [q] + [torch.randn(q.shape, generator=g).half().to(q.device) for _ in range(3)]
        expect = []
        for x in qs:
            o = out.clone()
            attention(x, cache, meta, scale, o, ONE)
            expect.append(o)
        got = [out.clone() for _ in qs]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        for x, o in zip(qs, got):
            attention(x, cache, meta, scale, o, SIDE, stream=s.cuda_stream)
        s.synchronize()
        found["same"] = [same_bits(a, b) for a, b in zip(got, expect)]
        out.copy_(got[0])

    case(SHAPES[1], 41, run)
    assert all(found["same"]), found


TWO_SM90 = torch.cuda.device_count() >= 2 and all(torch.cuda.get_device_capability(d)[0] == 9 for d in range(2))


@pytest.mark.skipif(not TWO_SM90, reason="needs 2 sm_90 GPUs")
def test_side_stream_on_each_of_two_gpus():
    """The side stream and its events are per device: device 1 first, then 0, then 1 again."""
    for device in (1, 0, 1):
        found = {}
        with torch.cuda.device(device):
            case(SHAPES[2], 50 + device, side_and_one(found), device=f"cuda:{device}")
        assert same_bits(found["side"], found["one"]), device
