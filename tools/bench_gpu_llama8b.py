"""End-to-end Llama-3-8B-shaped benchmark on one GPU (issue 4), random weights: lowbit's engine per recipe beside
HF transformers `generate` (bf16) and a torch.compile static-cache baseline (llama_torch_static.py), all on the
same f16 weights (llama_random.py draws each tensor from a seed of its name).

Each case: a batch of B distinct random 512-token prompts, 128 new tokens per request (greedy, no stop ids, so
every request makes exactly 128). Reported per case, median of `--repeats` runs after a warm-up:
  prefill tok/s  B*512 / (time until every request has its first token)
  decode tok/s   tokens made after that / the time after that; ms/step = that time / decode steps
  e2e tok/s      B*128 / whole request time
and per engine: load time, peak device memory (cudaMemGetInfo deltas, plus lowbit's allocator statistics or
torch's allocator peak). The batch-1 floor: bytes one decode step must read (weights in the recipe's format
with scales, the embedding row, the KV cache at the mean context 512 + 64) over the measured copy bandwidth.

Every engine runs in its own child process (clean memory figures; a crash or hang costs that part only, its
error is recorded).
  python3 tools/bench_gpu_llama8b.py out.json [--quick] [--parts torch,hf,lowbit] [--recipes ...]
  python3 tools/bench_gpu_llama8b.py out.json --parts lowbit:w8a8kv8,hf --deadline 380   # one slice of it
  python3 tools/bench_gpu_llama8b.py out.json --parts '' --merge a.json b.json   # combine earlier runs
A recipe may carry kernel overrides for an A/B in one run: --recipes w4a8kv8,w4a8kv8+linear.qkv=gemm_w4a8_sm80.
Measured on an H100: the torch part takes ~50 s, each lowbit recipe ~90 s (40 s of it loading), so the whole
run is ~7 min. transformers 5.x offline needs these wheels besides it: huggingface_hub, httpx2, httpcore2,
anyio, h11, idna, sniffio, certifi, truststore, safetensors, tokenizers, regex, pyyaml, tqdm, filelock,
packaging, fsspec, typing_extensions.
"""
import argparse
import collections
import dataclasses
import hashlib
import gc
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import time
import traceback

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import fmpq_random  # noqa: E402
from llama_random import (LLAMA3_8B, LlamaShape, quantize_e4m3, quantize_two_level, quantize_w4, quantize_w8, weight,  # noqa: E402
                          weight_names)

PROMPT, NEW = 512, 128
FIRST_TOKENS = 16  # tokens of request 0 kept per run: the engines compute the same model, so they should agree
RECIPES = ("w4a16kv8", "w8a8kv8", "w16a16")  # ascending memory


# ---------------------------------------------------------------------------------------------- helpers
def cuda():
    return torch.cuda.is_available()


def free_bytes():
    return torch.cuda.mem_get_info()[0] if cuda() else 0


def sync():
    if cuda():
        torch.cuda.synchronize()


def prompt_batch(batch, vocab):
    """The first `batch` rows of one fixed set of 64 random prompts: every engine sees the same ids."""
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab, (max(64, batch), PROMPT), generator=g)[:batch]


def graph_split(wall_ms_per_step, runs):
    """lowbit on the GPU (runs of lowbit_run): the replayed decode graphs' device ms per step (median over runs) and
    what the wall time per step leaves to the host; {} where no step replayed a graph."""
    runs = [r for r in runs if r.get("graph_steps")]
    if not runs:
        return {}
    dev = statistics.median(r["graph_device_ms"] / r["graph_steps"] for r in runs)
    return {"graph_steps": runs[0]["graph_steps"], "graph_device_ms_per_step": round(dev, 3),
            "host_gap_ms_per_step": round(wall_ms_per_step - dev, 3)}


def full_batch(steps, batch):
    """The steady state of a peak run: decode steps in which every one of the `batch` sequences made a token (after
    the last prefill chunk, before the first sequence finished), i.e. the static batch of the papers' protocol."""
    full = [s for s in steps if s[1] == batch]
    if not full:
        return {"steps": 0}
    ms = statistics.median(s[0] for s in full)
    graph = [s[2] for s in full if s[2] is not None]
    out = {"steps": len(full), "step_ms": round(ms, 3), "decode_tok_s": round(batch / ms * 1e3, 1)}
    if graph:
        dev = statistics.median(graph)
        out.update({"graph_device_ms": round(dev, 3), "host_gap_ms": round(ms - dev, 3)})
    walls = [s[3] for s in full if len(s) > 3 and s[3] is not None]
    if walls:  # medians of the nested host walls: step(), the ranks' hand-off, rank 0's decode_step
        step, ranks, rank0 = (statistics.median(w[i] for w in walls) for i in range(3))
        out["host_walls_ms"] = {"binding": round(ms - step, 3), "engine_step": round(step, 3),
                                "ranks_handoff": round(ranks, 3), "rank0_decode_step": round(rank0, 3)}
    return out


def summarize(engine, recipe, batch, runs):
    """runs: dicts with prefill_s, decode_s, total_s, decode_tokens, decode_steps, tokens -> one case row."""
    med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    pre, dec, tot = med("prefill_s"), med("decode_s"), med("total_s")
    toks, dtoks, dsteps = runs[0]["tokens"], runs[0]["decode_tokens"], runs[0]["decode_steps"]
    first = [r.pop("first_tokens") for r in runs if "first_tokens" in r]
    steps = [s for r in runs for s in r.pop("steps", [])]  # lowbit_run(per_step=True): the full-batch steady state
    return {**graph_split(1000 * dec / dsteps, runs), **({"full_batch": full_batch(steps, batch)} if steps else {}),
            "engine": engine, "recipe": recipe, "batch": batch, "tokens": toks,
            "prefill_s": round(pre, 4), "prefill_tok_s": round(batch * PROMPT / pre, 1),
            "decode_s": round(dec, 4), "decode_tokens": dtoks, "decode_steps": dsteps,
            "decode_tok_s": round(dtoks / dec, 1), "decode_ms_per_step": round(1000 * dec / dsteps, 3),
            "e2e_s": round(tot, 4), "e2e_tok_s": round(toks / tot, 1),
            "first_tokens": first[0] if first else None, "first_tokens_stable": all(f == first[0] for f in first),
            "runs": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in runs]}


class Part:
    """One engine's results, written to disk after every case so a timeout keeps what was measured."""

    def __init__(self, path, engine, recipe):
        self.path = path
        self.d = {"engine": engine, "recipe": recipe, "error": None, "cases": [], "memory": {}}
        self.free0 = free_bytes()
        self.min_free = self.free0

    def sample_memory(self):
        if cuda():
            self.min_free = min(self.min_free, free_bytes())
            self.d["memory"]["device_used_peak_bytes"] = self.free0 - self.min_free

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.d, f, indent=1)


# ---------------------------------------------------------------------------------------------- lowbit
def core_config(shape):
    """The engine's ModelConfig of a LlamaShape (untied lm_head)."""
    from lowbit import _core
    c = _core.ModelConfig()
    c.arch = "llama"
    c.vocab_size, c.hidden_size, c.intermediate_size = shape.vocab, shape.hidden, shape.inter
    c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim = shape.layers, shape.heads, shape.kv_heads, shape.head_dim
    c.rope_theta, c.rms_norm_eps, c.max_position_embeddings = shape.rope_theta, shape.eps, shape.max_positions
    c.tie_word_embeddings = False
    return c


def core_weight(name, w, recipe, dtype):
    """Linear weight `name` (a torch tensor on any device) quantized for `recipe` by the fast on-device
    quantizers, as the engine's QuantizedWeight on the host. a8 and a4 recipes keep lm_head in f16; w4a4 (FMPQ)
    takes the two-level qoq format of w4a8, so it needs no branch of its own (its block maps: lowbit_model)."""
    from lowbit import _core
    r = _core.parse_recipe(recipe)
    fmt = dtype if r["weight_bits"] == 16 else r["weight_format"]
    f = fmt if name != "lm_head.weight" or r["activation"] == "float16" else "f16"
    g = r["group"] or 128
    if f == "w4":
        q, s, z = quantize_w4(w, g)
        return _core.QuantizedWeight("w4", q.cpu(), s.cpu(), z.cpu(), group=g)
    if f == "w8":
        q, s = quantize_w8(w)
        return _core.QuantizedWeight("w8", q.cpu(), s.cpu())
    if f in ("qoq", "liquid"):
        q, s, z, cs = quantize_two_level(w, f, g)
        return _core.QuantizedWeight(f, q.cpu(), s.cpu(), z.cpu(), cs.cpu(), g)
    if f == "e4m3":
        q, s = quantize_e4m3(w)
        return _core.QuantizedWeight("e4m3", q.cpu(), s.cpu())
    return _core.QuantizedWeight(f, w.to(getattr(torch, {"f16": "float16", "f32": "float32"}[f])).cpu())


def lowbit_model(shape, recipe, device, dtype, kernel_overrides=None, fmpq_int8_fraction=fmpq_random.INT8_FRACTION):
    """w4a4 (FMPQ) recipes also get a block map with `fmpq_int8_fraction` int8 blocks and an input permutation per
    decoder linear (fmpq_random.py); the other recipes ignore it."""
    from lowbit import _core
    gen = "cuda" if cuda() else "cpu"
    m = _core.Model(core_config(shape), recipe, device, dtype)
    if kernel_overrides:
        m.set_kernel_options(kernel_overrides)
    fmpq = _core.parse_recipe(recipe)["activation"] == "fmpq_mixed"
    for name, shp, linear in weight_names(shape):
        w = weight(name, shp, gen)
        if linear:
            bits = perm = None
            if fmpq and name != "lm_head.weight":  # lm_head keeps float activations
                bits, perm = fmpq_random.inputs(name, shp[1], fmpq_int8_fraction)
                if perm is not None:  # the engine feeds x[:, perm]: the same model needs w[:, perm]
                    w = w[:, perm.to(w.device, torch.long)]
            m.set_quantized_weight(name, core_weight(name, w, recipe, dtype))
            if bits is not None:
                m.set_fmpq_block_bits(name, bits)
            if perm is not None:
                m.set_input_permutation(name, perm)
        else:
            m.set_weight(name, w.cpu())
    if cuda():
        torch.cuda.empty_cache()
    m.finalize()
    return m


def lowbit_run(eng, prompts, new, rid0, per_step=False):
    """One batch of requests to completion; the prefill phase ends when every request has its first token.
    per_step: also each decode-phase step's wall ms, tokens, replayed-graph device ms and host walls ("steps": [[ms,
    tokens, graph ms or None, [step(), ranks, rank 0 ms] or None]]), for the full-batch steady state
    (bench_gpu_tp.py)."""
    B = len(prompts)
    for i, p in enumerate(prompts):
        eng.add_request(rid0 + i, p, temperature=0.0, max_tokens=new)  # no stop ids: EOS ignored
    first, made, t_pre, dec_tokens, dec_steps, toks0, graphs0 = set(), 0, None, 0, 0, [], None
    # Replayed decode graphs' device time (engine stats): over the decode phase, the wall time less it is the time
    # the GPU waited on the host (bookkeeping, Python, the step's sync).
    graph_time = lambda s: (s["decode_graph_steps"], s["decode_graph_ms"] + s["decode_upload_ms"])  # noqa: E731
    # per_step: the replayed step's host walls too (EngineStats: step(), the ranks' hand-off, rank 0's decode_step)
    walls = lambda s: [s.get(k, 0.0) for k in ("decode_step_wall_ms", "decode_ranks_wall_ms",  # noqa: E731
                                               "decode_rank0_wall_ms")]
    steps, prev = [], None  # per_step: prev = the stats after the last step (one read per step)
    t0 = t_last = time.perf_counter()
    while eng.has_unfinished():
        evs = eng.step()
        # a step's period: since the previous step() returned, this loop's own work included (with overlap_steps a
        # step() returns before the GPU finishes the next step, so its call alone would not be the step's time)
        now = time.perf_counter()
        ms, t_last = (now - t_last) * 1e3, now
        n = sum(ev.token >= 0 for ev in evs)
        if per_step and prev is not None:
            cur = eng.stats()
            replayed = cur["decode_graph_steps"] > prev["decode_graph_steps"]
            steps.append([ms, n, graph_time(cur)[1] - graph_time(prev)[1] if replayed else None,
                          [a - b for a, b in zip(walls(cur), walls(prev))] if replayed else None])
            prev = cur
        toks0 += [ev.token for ev in evs if ev.request_id == rid0 and ev.token >= 0]
        made += n
        if t_pre is None:
            first.update(ev.request_id for ev in evs if ev.token >= 0)
            if len(first) == B:
                t_pre = time.perf_counter() - t0
                prev = eng.stats()
                graphs0 = graph_time(prev)
        else:
            dec_tokens += n
            dec_steps += 1
    total = time.perf_counter() - t0
    graphs1 = graph_time(eng.stats())
    assert made == B * new, f"{made} tokens generated, expected {B * new}"
    return {"prefill_s": t_pre, "decode_s": total - t_pre, "total_s": total, "tokens": made,
            "decode_tokens": dec_tokens, "decode_steps": dec_steps, "first_tokens": toks0[:FIRST_TOKENS],
            "graph_steps": graphs1[0] - graphs0[0], "graph_device_ms": graphs1[1] - graphs0[1],
            **({"steps": steps} if per_step else {})}


def part_file(out, part):
    """The child's JSON beside `out`: the part's spec in the name, or its head and a hash when the spec (kernel
    overrides) would make a file name too long for the file system."""
    name = part.replace(":", "_")
    if len(name) > 80:
        name = name[:48] + "-" + hashlib.sha1(part.encode()).hexdigest()[:12]
    return f"{out}.{name}.part"


def split_spec(spec):
    """A lowbit part's spec, "recipe+key=value+...", for A/Bs in one run: kernel overrides (e.g.
    +linear.qkv=gemm_w4a8_sm80), except "+overlap=off", the engine's overlap_steps. -> (recipe, overrides, overlap)."""
    recipe, *pairs = spec.split("+")
    overrides = dict(o.split("=", 1) for o in pairs)
    return recipe, overrides, overrides.pop("overlap", "on") != "off"


def part_lowbit(args, shape, out, recipe):
    from lowbit import _core
    part = Part(out, "lowbit", recipe)
    device, dtype = ("cuda", "f16") if cuda() else ("cpu", "f32")
    stats = lambda: dict(_core.allocator_stats(device)) if device == "cuda" else {}  # noqa: E731
    t = time.perf_counter()
    base, kernel_overrides, overlap = split_spec(recipe)
    model = lowbit_model(shape, base, device, dtype, kernel_overrides)
    part.d["load_s"] = round(time.perf_counter() - t, 2)
    info = model.info()
    part.d["info"] = info
    pb = info["parameter_bytes"]
    # per decode step: every packed weight but the embedding, of which one row per sequence is read
    part.d["weight_bytes_per_token"] = sum(v for k, v in pb.items() if k != "embedding") + 2 * shape.hidden
    part.d["kv_bytes_per_token"] = info["kv_bytes_per_token"]
    max_b = max(args.batches)
    kv_bytes = info["kv_bytes_per_token"] * max_b * (PROMPT + NEW + 64)
    eng = _core.Engine(model, max_batch_tokens=args.max_batch_tokens, max_seqs=max(64, max_b),
                       kv_cache_bytes=kv_bytes, prefix_caching=False,  # repeated prompts are prefilled every run
                       overlap_steps=overlap)
    part.d["engine_config"] = {"max_batch_tokens": args.max_batch_tokens, "max_seqs": max(64, max_b),
                               "kv_cache_bytes": kv_bytes, "block_size": 16, "overlap_steps": overlap}
    part.sample_memory()
    part.d["memory"]["after_load"] = stats()
    part.save()
    print(f"lowbit {recipe}: loaded in {part.d['load_s']} s, {info['parameter_bytes']}", flush=True)
    rid = 0
    warm = prompt_batch(min(8, max_b), shape.vocab).tolist()
    lowbit_run(eng, warm, 4, rid)  # kernels loaded, allocator caches filled, a full prefill chunk
    rid += len(warm)
    for B in args.batches:
        try:
            prompts = prompt_batch(B, shape.vocab).tolist()
            runs = []
            for _ in range(args.repeats):
                runs.append(lowbit_run(eng, prompts, NEW, rid))
                rid += B
                part.sample_memory()
            part.d["cases"].append(summarize("lowbit", recipe, B, runs))
            print(json.dumps({k: v for k, v in part.d["cases"][-1].items() if k != "runs"}), flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, the next batch still runs
            part.d["cases"].append({"engine": "lowbit", "recipe": recipe, "batch": B, "error": repr(e)})
            traceback.print_exc()
        part.d["memory"]["allocator"] = stats()
        part.save()
    del eng, model


# ---------------------------------------------------------------------------------------------- HF
def part_hf(args, shape, out):
    from transformers import LlamaConfig, LlamaForCausalLM
    import transformers
    part = Part(out, "transformers", "bf16")
    part.d["version"] = transformers.__version__
    dev = "cuda" if cuda() else "cpu"
    dt = torch.bfloat16 if cuda() else torch.float32
    cfg = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.inter,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, rope_theta=shape.rope_theta,
                      rms_norm_eps=shape.eps, max_position_embeddings=shape.max_positions,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    t = time.perf_counter()
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        with torch.device(dev):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weight(name, tuple(p.shape), dev))
    model.eval()
    sync()
    part.d["load_s"] = round(time.perf_counter() - t, 2)
    part.d["rope"] = {"inv_freq_1": float(model.model.rotary_emb.inv_freq[1])}
    part.d["weight_bytes_per_token"] = (sum(p.numel() for p in model.parameters()) - shape.vocab * shape.hidden
                                        + shape.hidden) * 2
    part.d["kv_bytes_per_token"] = shape.layers * 2 * shape.kv_size * 2
    part.sample_memory()
    part.save()

    def gen(ids, n):
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            o = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0)
        sync()
        assert o.shape[1] - ids.shape[1] == n, f"generated {o.shape[1] - ids.shape[1]} tokens, expected {n}"
        return time.perf_counter() - t0, o[0, ids.shape[1]:ids.shape[1] + FIRST_TOKENS].tolist()

    gen(prompt_batch(2, shape.vocab).to(dev), 4)
    for B in args.batches:
        try:
            ids = prompt_batch(B, shape.vocab).to(dev)
            runs = []
            for _ in range(args.repeats):
                pre, _ = gen(ids, 1)  # prompt + the first token, as the other engines' prefill phase
                tot, toks = gen(ids, NEW)
                part.sample_memory()
                runs.append({"prefill_s": pre, "decode_s": tot - pre, "total_s": tot, "tokens": B * NEW,
                             "decode_tokens": B * (NEW - 1), "decode_steps": NEW - 1, "first_tokens": toks})
            part.d["cases"].append(summarize("transformers", "bf16", B, runs))
            print(json.dumps({k: v for k, v in part.d["cases"][-1].items() if k != "runs"}), flush=True)
        except Exception as e:  # noqa: BLE001
            part.d["cases"].append({"engine": "transformers", "recipe": "bf16", "batch": B, "error": repr(e)})
            traceback.print_exc()
        if cuda():
            part.d["memory"]["torch_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        part.save()


# ---------------------------------------------------------------------------------------------- torch.compile
def torch_static_model(args, shape, part):
    """The torch.compile static-cache baseline (f16 on the GPU, f32 on the CPU) and its device; records the torch
    version and the load time in part."""
    from llama_torch_static import StaticLlama
    part.d["version"] = torch.__version__
    dev = "cuda" if cuda() else "cpu"
    dt = torch.float16 if cuda() else torch.float32
    t = time.perf_counter()
    model = StaticLlama(shape, dev, dt, compile_layer=not args.no_compile)
    sync()
    part.d["load_s"] = round(time.perf_counter() - t, 2)
    return model, dev


def part_torch(args, shape, out):
    part = Part(out, "torch_compile", "f16")
    model, dev = torch_static_model(args, shape, part)
    part.d["weight_bytes_per_token"] = model.weight_bytes() + 2 * shape.hidden
    part.d["kv_bytes_per_token"] = shape.layers * 2 * shape.kv_size * 2
    part.d["method"] = ("one decoder layer torch.compile'd (inductor, fullgraph, static shapes), the whole decode "
                        "step captured in one CUDA graph; prefill eager with flash SDPA; argmax on the GPU")
    part.sample_memory()
    part.save()
    for B in args.batches:
        try:
            ids = prompt_batch(B, shape.vocab).to(dev)
            model.set_batch(B, PROMPT + NEW)
            t = time.perf_counter()
            model.prefill(ids)
            if cuda():
                model.capture()
            sync()
            part.d.setdefault("compile_capture_s", {})[str(B)] = round(time.perf_counter() - t, 2)
            runs = []
            for _ in range(args.repeats + 1):  # the first is the warm-up
                sync()
                t0 = time.perf_counter()
                model.prefill(ids)
                sync()
                t1 = time.perf_counter()
                model.decode(NEW - 1)
                sync()
                t2 = time.perf_counter()
                part.sample_memory()
                toks = model.history[0, PROMPT:PROMPT + FIRST_TOKENS].tolist()
                runs.append({"prefill_s": t1 - t0, "decode_s": t2 - t1, "total_s": t2 - t0, "tokens": B * NEW,
                             "decode_tokens": B * (NEW - 1), "decode_steps": NEW - 1, "first_tokens": toks})
            part.d["cases"].append(summarize("torch_compile", "f16", B, runs[1:]))
            print(json.dumps({k: v for k, v in part.d["cases"][-1].items() if k != "runs"}), flush=True)
        except Exception as e:  # noqa: BLE001
            part.d["cases"].append({"engine": "torch_compile", "recipe": "f16", "batch": B, "error": repr(e)})
            traceback.print_exc()
        if cuda():
            part.d["memory"]["torch_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        part.save()


# ---------------------------------------------------------------------------------------------- driver
def worker(args):
    shape = shape_of(args)
    part = args.worker
    try:
        if part == "hf":
            part_hf(args, shape, args.worker_out)
        elif part == "torch":
            part_torch(args, shape, args.worker_out)
        elif part.startswith("lowbit:"):
            part_lowbit(args, shape, args.worker_out, part.split(":", 1)[1])
        else:
            raise ValueError(f"unknown part {part!r}")
    except Exception as e:  # noqa: BLE001 - the parent records the error string
        traceback.print_exc()
        d = {}
        if os.path.exists(args.worker_out):
            with open(args.worker_out) as f:
                d = json.load(f)
        d["error"] = f"{type(e).__name__}: {e}"
        with open(args.worker_out, "w") as f:
            json.dump(d, f, indent=1)
        sys.exit(1)


def run_child(args, part, tmp, script=__file__):
    """Runs one part in a child process (`script --worker part`), echoing its output; returns its JSON (with an
    error on failure)."""
    if os.path.exists(tmp):
        os.remove(tmp)
    cmd = [sys.executable, os.path.abspath(script), "--worker", part, "--worker-out", tmp] + args.passthrough
    print(f"== {part}", flush=True)
    tail = collections.deque(maxlen=15)
    t0 = time.perf_counter()
    limit = min(args.part_timeout, args.deadline_at - time.time() - 10)
    # own session: a timeout kills the child's compile workers too
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True)
    timed_out = False
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = limit - (time.perf_counter() - t0)
            if left <= 0:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                break
            if sel.select(timeout=min(left, 5)):
                line = proc.stdout.readline()
                if not line:
                    break
                print("  " + line.rstrip(), flush=True)
                tail.append(line.rstrip())
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    d = {}
    if os.path.exists(tmp):
        with open(tmp) as f:
            d = json.load(f)
    d.setdefault("engine", part)
    d["part"] = part
    d["wall_s"] = round(time.perf_counter() - t0, 1)
    if timed_out:
        d["error"] = (d.get("error") or "") + f" timed out after {limit:.0f} s"
    elif proc.returncode != 0 and not d.get("error"):
        d["error"] = f"exit code {proc.returncode}: " + " | ".join(list(tail)[-4:])
    return d


def shape_of(args):
    s = LLAMA3_8B
    if args.tiny:
        s = LlamaShape(vocab=512, hidden=256, inter=512, layers=2, heads=8, kv_heads=2, head_dim=32,
                       max_positions=1024)
    if args.layers:
        s = dataclasses.replace(s, layers=args.layers)
    return s


def floors(parts, copy_gbs):
    """Batch-1 decode floor per engine: bytes per step / copy bandwidth, and the measured fraction of it."""
    out = []
    for p in parts:
        if not p.get("weight_bytes_per_token") or not copy_gbs:
            continue
        kv = p["kv_bytes_per_token"] * (PROMPT + NEW // 2)
        total = p["weight_bytes_per_token"] + kv
        floor = copy_gbs * 1e9 / total
        b1 = next((c for c in p.get("cases", []) if c.get("batch") == 1 and "decode_tok_s" in c), None)
        out.append({"engine": p["engine"], "recipe": p["recipe"], "weight_bytes": p["weight_bytes_per_token"],
                    "kv_bytes_mean_context": kv, "bytes_per_token": total,
                    "floor_tok_s": round(floor, 1), "floor_ms_per_step": round(1000 / floor, 3),
                    "measured_decode_tok_s": b1 and b1["decode_tok_s"],
                    "fraction_of_floor": b1 and round(b1["decode_tok_s"] / floor, 3)})
    return out


def table(payload):
    lines = ["engine / recipe        | B  | prefill tok/s | decode tok/s (ms/step) | e2e tok/s | peak GB | load s"]
    for p in payload["parts"]:
        mem = p.get("memory", {})
        peak = mem.get("device_used_peak_bytes")
        name = f"{p.get('engine')} {p.get('recipe', '')}"
        if p.get("error") and not p.get("cases"):
            lines.append(f"{name:<22} | FAILED: {p['error'][:150]}")
            continue
        for c in p.get("cases", []):
            if "error" in c:
                lines.append(f"{name:<22} | {c['batch']:<2} | FAILED: {c['error'][:120]}")
                continue
            lines.append(f"{name:<22} | {c['batch']:<2} | {c['prefill_tok_s']:>13.0f} | "
                         f"{c['decode_tok_s']:>9.1f} ({c['decode_ms_per_step']:>7.2f})   | {c['e2e_tok_s']:>9.1f} | "
                         f"{(peak or 0) / 1e9:>7.1f} | {p.get('load_s', '')}")
            if "host_gap_ms_per_step" in c:
                lines.append(f"{'':<22} | {c['batch']:<2} | decode graph {c['graph_device_ms_per_step']:.3f} ms/step on "
                             f"the GPU, {c['host_gap_ms_per_step']:.3f} ms/step waiting on the host")
        if p.get("error") and p.get("cases"):
            lines.append(f"{name:<22} | (then failed: {p['error'][:120]})")
    for f in payload.get("floor", []):
        lines.append(f"floor {f['engine']} {f['recipe']}: {f['bytes_per_token'] / 1e9:.2f} GB/token -> "
                     f"{f['floor_tok_s']:.0f} tok/s ({f['floor_ms_per_step']:.2f} ms); batch-1 measured "
                     f"{f['measured_decode_tok_s']} tok/s = {f['fraction_of_floor']} of floor")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--quick", action="store_true", help="4 layers, batches 1 and 16 (smoke test)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (CPU test of the harness)")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--batches", default="")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", default="torch,hf,lowbit")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--max-batch-tokens", type=int, default=4096)
    ap.add_argument("--part-timeout", type=float, default=400, help="seconds per engine (child process)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for the whole run (0: none); parts that "
                    "would run past it are recorded as skipped")
    ap.add_argument("--no-compile", action="store_true", help="torch baseline without torch.compile")
    ap.add_argument("--merge", nargs="*", default=[], help="earlier JSON outputs whose parts are kept")
    ap.add_argument("--tag", default="", help="a label stored with each part (e.g. quick)")
    ap.add_argument("--worker", default="")
    ap.add_argument("--worker-out", default="")
    args = ap.parse_args()
    if args.quick and not args.layers:
        args.layers = 4
    args.batches = [int(b) for b in (args.batches or ("1,16" if args.quick else "1,16,64")).split(",")]
    if args.worker:
        return worker(args)
    args.deadline_at = time.time() + (args.deadline or 1e9)
    args.passthrough = ["--quick"] * args.quick + ["--tiny"] * args.tiny + ["--no-compile"] * args.no_compile
    args.passthrough += ["--layers", str(args.layers), "--batches", ",".join(map(str, args.batches)),
                         "--repeats", str(args.repeats), "--max-batch-tokens", str(args.max_batch_tokens)]
    shape = shape_of(args)

    merged = []
    for path in args.merge:
        with open(path) as f:
            merged += json.load(f)["parts"]
    meta = {}
    copy_gbs = None
    if cuda():
        from bench_gpu_common import copy_bandwidth_gbs, device_meta
        meta = device_meta()
        # the commit of the lowbit build under test (the runner's git checkout may be of another revision)
        meta["commit"] = os.environ.get("LOWBIT_COMMIT") or meta["commit"]
        copy_gbs = copy_bandwidth_gbs()
        gc.collect()
        torch.cuda.empty_cache()
    elif args.merge:
        with open(args.merge[0]) as f:
            meta = json.load(f)["meta"]
        copy_gbs = meta.get("copy_bandwidth_gbs")
    meta.update({"model": dataclasses.asdict(shape), "prompt_tokens": PROMPT, "new_tokens": NEW,
                 "batches": args.batches, "repeats": args.repeats,
                 "timing": "wall time around synchronised loops (per request batch: prefill phase, decode phase)",
                 "statistic": f"median of {args.repeats} runs after a warm-up",
                 "copy_bandwidth_gbs": copy_gbs and round(copy_gbs, 1)})
    if args.merge:
        meta["merged_from"] = args.merge

    todo = []  # in the order given, "lowbit" standing for one part per recipe (or name one: lowbit:w4a16kv8)
    for p in (p for p in args.parts.split(",") if p):
        todo += [f"lowbit:{r}" for r in args.recipes.split(",") if r] if p == "lowbit" else [p]
    out = args.out or "/tmp/bench_llama8b.json"
    fresh = []

    def write():
        ok = lambda p: any("decode_tok_s" in c for c in p.get("cases", []))  # noqa: E731
        keys = {(p.get("engine"), p.get("recipe")) for p in fresh if ok(p)}  # a failed rerun keeps the old part
        allp = [p for p in merged if (p.get("engine"), p.get("recipe")) not in keys]
        allp += [p for p in fresh if ok(p) or (p.get("engine"), p.get("recipe")) not in
                 {(m.get("engine"), m.get("recipe")) for m in merged}]
        payload = {"meta": meta, "parts": allp, "floor": floors(allp, copy_gbs)}
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(payload, f, indent=1)
        return payload

    payload = write()
    for part in todo:
        if args.deadline_at - time.time() < 30:
            fresh.append({"engine": part, "part": part, "error": "skipped: past the run's --deadline"})
            continue
        d = run_child(args, part, part_file(out, part))
        d["commit"] = meta.get("commit", "")
        if args.tag:
            d["tag"] = args.tag
        fresh.append(d)
        payload = write()
    payload = write()  # parts skipped at the deadline too
    print(table(payload), flush=True)


if __name__ == "__main__":
    main()
