"""Overlapped decode steps (EngineConfig::overlap_steps, on by default): while a CUDA-graph decode step runs, the
engine queues the next one behind it, its token ids fed on the GPU from the running step's sampled tokens, and
hands out the running step's tokens meanwhile. With the same rows in the same batch bucket both modes run the
same graphs, so tokens and logprobs must be equal bit for bit to the serial engine's: through finishes by length
(predicted, never queued) and by stop token (one queued row dropped), seeded sampling (the per-request random
draw follows the token count, placeholders included), aborts while a step is queued and sessions. Requests that
arrive while steps run change the batches, so there the tokens are checked against the CPU model instead."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_engine import greedy_margin_violations, random_llama

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

RECIPES = ["w16a16", "w4a8kv8", "w4a16kv4"]


def make_engine(model, overlap):
    return _core.Engine(model, max_batch_tokens=512, max_seqs=8, overlap_steps=overlap)


def drive(eng, requests, abort=None):
    """Adds requests [(prompt, opts)] as ids 0.. and steps until done; abort = (calls, id) aborts that request after
    that many step() calls. Returns the (token, logprob) lists, the finish reasons and the engine's stats."""
    for i, (prompt, opts) in enumerate(requests):
        eng.add_request(i, prompt, **opts)
    out, reasons, calls = {i: [] for i in range(len(requests))}, {}, 0
    while eng.has_unfinished():
        if abort is not None and calls == abort[0]:
            eng.abort(abort[1])
        for ev in eng.step():
            if ev.token >= 0:
                out[ev.request_id].append((ev.token, ev.logprob))
            if ev.finished:
                reasons[ev.request_id] = ev.finish_reason
        calls += 1
    return [out[i] for i in range(len(requests))], [reasons.get(i) for i in range(len(requests))], eng.stats()


def prompts(seed, lengths):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 1000, (n,), generator=g).tolist() for n in lengths]


def first_new_token(tokens, start):
    """The first position >= start whose token does not occur before it (a stop id that ends the request there)."""
    ids = [t for t, _ in tokens]
    found = [i for i in range(start, len(ids)) if ids[i] not in ids[:i]]
    assert found, f"no new token at or after position {start}: {ids}"
    return found[0]


# Requests that must stop on a token first seen late in their output sample (seeded: both modes draw the same) from
# models whose embedding is small (SCALE): with the tied embedding at full scale a random model repeats its last token.
HOT = dict(temperature=1.0)
SCALE = dict(embed_scale=0.05)


@pytest.mark.parametrize("recipe", RECIPES)
def test_overlapped_steps_equal_serial_steps(recipe):
    model = random_llama(recipe, "cuda", "f16", seed=3, **SCALE)
    ps = prompts(11, (3, 17, 40, 9))
    # request 1 samples (seeded): a random model's greedy text repeats, and its stop id must first occur late
    opts = [dict(temperature=0.0, max_tokens=12), dict(**HOT, seed=5, max_tokens=20),
            dict(temperature=0.8, top_p=0.9, seed=11, max_tokens=27), dict(temperature=0.0, max_tokens=33)]
    first, _, _ = drive(make_engine(model, False), list(zip(ps, opts)))
    stop_at = first_new_token(first[1], 4)
    opts[1]["stop_token_ids"] = [first[1][stop_at][0]]  # request 1 now stops there, with 3 others still running
    ref, ref_reasons, ref_stats = drive(make_engine(model, False), list(zip(ps, opts)))
    got, got_reasons, got_stats = drive(make_engine(model, True), list(zip(ps, opts)))
    assert [len(t) for t in ref] == [12, stop_at + 1, 27, 33]
    assert ref_reasons == got_reasons == ["length", "stop", "length", "length"]
    assert got == ref  # tokens and logprobs, bit for bit
    assert ref_stats["overlapped_steps"] == 0 and ref_stats["dropped_rows"] == 0
    # every decode step after the first graph step of the run is queued behind the one before it; the stop
    # token's row was queued once more and dropped
    assert got_stats["overlapped_steps"] >= 25 and got_stats["dropped_rows"] == 1
    assert got_stats["generated_tokens"] == ref_stats["generated_tokens"]
    assert got_stats["num_free_blocks"] == got_stats["num_blocks"]  # every row's KV given back (or cached, evictable)


def test_abort_while_a_step_is_queued():
    model = random_llama("w16a16", "cuda", "f16", seed=4)
    requests = [(p, dict(temperature=0.0, max_tokens=16)) for p in prompts(12, (5, 30, 12, 21))]
    ref, ref_reasons, _ = drive(make_engine(model, False), requests, abort=(6, 3))
    got, got_reasons, stats = drive(make_engine(model, True), requests, abort=(6, 3))
    assert ref_reasons == got_reasons == ["length", "length", "length", "abort"]
    assert len(got[3]) == 6 and got == ref  # 4 rows, then 3: one batch bucket, so equal bit for bit
    assert stats["dropped_rows"] == 1  # the aborted request's queued row
    assert stats["num_free_blocks"] == stats["num_blocks"] and stats["running"] == 0


def test_session_continued_after_a_stop_in_a_queued_step():
    """A request that stops on a stop token keeps its KV in its session while the queued step still writes its
    dropped row; the next turn reuses that KV and decodes as the serial engine does."""
    model = random_llama("w4a8kv8", "cuda", "f16", seed=5, **SCALE)
    p0, q0, q1 = prompts(13, (19, 7, 5))
    plain, _, _ = drive(make_engine(model, False), [(p0, dict(**HOT, seed=3, max_tokens=24)),
                                                   (q0, dict(temperature=0.0, max_tokens=24))])
    stop = plain[0][first_new_token(plain[0], 5)][0]
    results = []
    for overlap in (False, True):
        eng = make_engine(model, overlap)
        turn1, reasons, _ = drive(eng, [(p0, dict(**HOT, seed=3, max_tokens=24, session_id=1,
                                                  stop_token_ids=[stop])),
                                        (q0, dict(temperature=0.0, max_tokens=24))])
        assert reasons == ["stop", "length"]
        history = p0 + [t for t, _ in turn1[0]]
        eng.add_request(10, history + q1, temperature=0.0, max_tokens=12, session_id=1)
        turn2 = []
        while eng.has_unfinished():
            turn2 += [(ev.token, ev.logprob) for ev in eng.step() if ev.token >= 0]
        assert eng.stats()["prefill_tokens"] < len(p0) + len(q0) + len(history) + len(q1)  # the session's KV reused
        results.append((turn1, turn2))
    assert results[1] == results[0]


def test_requests_arriving_while_steps_run():
    """Requests added between steps: the queued step is taken, the scheduler admits them, overlap resumes. The
    batches differ from the serial engine's, so each greedy token is checked against the CPU model's argmax."""
    shape = dict(seed=6)
    model = random_llama("w16a16", "cuda", "f16", **shape)
    ps = prompts(14, (8, 33, 2, 15, 26))
    eng = make_engine(model, True)
    out = {i: [] for i in range(len(ps))}
    for i in (0, 1):
        eng.add_request(i, ps[i], temperature=0.0, max_tokens=20)
    calls = 0
    while eng.has_unfinished():
        if calls in (4, 9):
            for i in ((2, 3) if calls == 4 else (4,)):
                eng.add_request(i, ps[i], temperature=0.0, max_tokens=20)
        for ev in eng.step():
            if ev.token >= 0:
                out[ev.request_id].append(ev.token)
        calls += 1
    tokens = [out[i] for i in range(len(ps))]
    assert [len(t) for t in tokens] == [20] * len(ps)
    assert eng.stats()["overlapped_steps"] > 10
    cpu = random_llama("w16a16", "cpu", "f32", **shape)
    assert greedy_margin_violations(_core.Engine(cpu), ps, tokens, 0.1) == []


def test_host_sampled_rows_are_not_overlapped():
    """A row the device cannot sample (top logprobs here) needs its logits on the host before the next step:
    no step is queued while it runs, and the tokens equal the serial engine's."""
    model = random_llama("w16a16", "cuda", "f16", seed=7)
    requests = [(p, dict(temperature=0.0, max_tokens=10)) for p in prompts(15, (6, 11))]
    requests[1][1]["logprobs"] = 2
    ref, _, _ = drive(make_engine(model, False), requests)
    got, _, stats = drive(make_engine(model, True), requests)
    assert got == ref and stats["overlapped_steps"] == 0


def test_overlapped_steps_are_timed_like_serial_ones():
    """Batch 1, 24 tokens: the prefill samples the first, 23 graph steps follow; every one after the first is queued
    behind the one before (22), the last is planned by length (nothing dropped), and the same 22 replays are timed
    as with serial steps (the capturing step is not)."""
    model = random_llama("w16a16", "cuda", "f16", seed=5)
    prompt = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    runs = []
    for overlap in (False, True):
        tokens, reasons, stats = drive(make_engine(model, overlap), [(prompt, dict(temperature=0.0, max_tokens=24))])
        runs.append(tokens)
        assert reasons == ["length"] and stats["decode_graph_steps"] == 22
        assert stats["overlapped_steps"] == (22 if overlap else 0) and stats["dropped_rows"] == 0
        assert stats["decode_graph_ms"] > 0
    assert runs[0] == runs[1]


@pytest.mark.skipif(not (_core.nccl_available()[0] and torch.cuda.device_count() >= 2),
                    reason="needs 2 GPUs and a build with NCCL")
def test_tensor_parallel_overlapped_steps_equal_serial_steps():
    """TP=2 over NCCL: rank 0 samples; a queued step's other rank copies rank 0's tokens from its GPU once rank 0's
    event says they are there. Both modes must agree bit for bit, a stop token's dropped row included."""
    comms = _core.make_nccl_communicators([0, 1])
    models = [random_llama("w16a16", f"cuda:{r}", "f16", seed=8, communicator=comms[r], **SCALE) for r in range(2)]
    ps = prompts(16, (4, 23, 9, 14))
    opts = [dict(temperature=0.0, max_tokens=14), dict(**HOT, seed=2, max_tokens=22),
            dict(temperature=0.0, max_tokens=18), dict(temperature=0.7, seed=9, max_tokens=25)]
    first, _, _ = drive(_core.Engine(models, max_batch_tokens=512, max_seqs=8, overlap_steps=False),
                        list(zip(ps, opts)))
    opts[1]["stop_token_ids"] = [first[1][first_new_token(first[1], 4)][0]]
    runs = [drive(_core.Engine(models, max_batch_tokens=512, max_seqs=8, overlap_steps=overlap), list(zip(ps, opts)))
            for overlap in (False, True)]
    assert runs[0][1] == runs[1][1] and runs[0][1][1] == "stop"
    assert runs[1][0] == runs[0][0]
    assert runs[1][2]["overlapped_steps"] > 10 and runs[1][2]["dropped_rows"] == 1
