"""`lowbit <verb>`: generate, chat, serve, perplexity, quantize, bench, info."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_PROMPT = "The three most useful things to know about large language models are"


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=".gguf file or HF model directory (default: SmolLM2-135M-Instruct)")
    p.add_argument("--load-format", default="auto", choices=("auto", "random"),
                   help="auto: read the weights; random: --model is a directory with config.json (tokenizer.json "
                        "optional) and the weights are drawn at random, for benchmarks (default auto)")
    p.add_argument("--recipe", default=None,
                   help="precision recipe, e.g. w16a16, w8a16, w4a16 (default: the file's own precision: "
                        "a GGUF Q4_0/Q4_1 file runs w4a16g32, Q8_0 w8a16g32 as stored; other files w16a16)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default=None, help="compute dtype f32|f16|bf16 (default: f32 on the CPU, f16 on a GPU)")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.9,
                   help="GPU: share of the device memory the process may fill; the KV cache gets the rest (default 0.9)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="GPU: run decode steps without CUDA graphs")
    p.add_argument("--no-overlap", action="store_true",
                   help="GPU: wait for each decode step before queueing the next (overlap_steps=False)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no load progress on stderr")
    p.add_argument("--kernel", action="append", default=[], metavar="ROLE=KERNEL",
                   help="kernel override, e.g. linear.qkv=gemm_w4a16_sm80 or pdl=off (repeatable; see "
                        "docs/architecture.md)")
    p.add_argument("--strict", action="store_true", help="refuse slow fallback kernels (an error at load)")
    p.add_argument("--tp", "--tensor-parallel", dest="tp", type=int, default=1,
                   help="tensor parallelism: shard the model over N GPUs (cuda:i..cuda:i+N-1, NCCL) or N CPU threads "
                        "(default 1)")


def _add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate (default {max_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lowbit", description="lowbit: mixed-precision LLM inference")
    verbs = parser.add_subparsers(dest="verb", required=True)

    g = verbs.add_parser("generate", help="complete prompts (or chat turns with --chat)")
    _add_model_args(g)
    _add_sampling_args(g, 64)
    g.add_argument("prompts", nargs="*", help="prompt texts (batched together)")
    g.add_argument("--prompt", action="append", default=None, help="prompt text (repeatable; batched)")
    g.add_argument("--raw", action="store_true",
                   help="plain text completion; by default a model with a chat template gets each prompt as a user turn")

    c = verbs.add_parser("chat", help="interactive multi-turn chat (streaming); /exit or EOF quits")
    _add_model_args(c)
    _add_sampling_args(c, 256)
    c.add_argument("--system", default=None, help="system message")

    s = verbs.add_parser("serve", help="OpenAI-compatible HTTP server (needs: pip install 'lowbit[serve]'; "
                         "see docs/serving.md)")
    _add_model_args(s)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--served-model-name", default=None,
                   help="the model name clients send and /v1/models lists (default: the model file's name)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* routes")
    s.add_argument("--max-seqs", type=int, default=64, help="sequences the engine runs at once (default 64)")
    s.add_argument("--kv-cache-memory", type=int, default=None,
                   help="KV cache size in bytes (default: the engine's own choice)")
    s.add_argument("--no-prefix-caching", action="store_true",
                   help="turn off automatic prefix caching (on by default: requests sharing a prompt prefix reuse "
                        "its KV blocks)")
    s.add_argument("--max-queue", type=int, default=256,
                   help="sequences that may wait beyond --max-seqs; more get 503 (default 256)")
    s.add_argument("--log-level", default="info", help="uvicorn log level (default info)")

    pp = verbs.add_parser("perplexity", help="perplexity of a text file (non-overlapping windows)")
    _add_model_args(pp)
    pp.add_argument("--text", required=True, help="UTF-8 text file")
    pp.add_argument("--window", type=int, default=1024)
    pp.add_argument("--max-tokens", type=int, default=4096)

    b = verbs.add_parser("bench", help="prefill tok/s (512-token prompt) and decode tok/s (128 new tokens)")
    _add_model_args(b)
    b.add_argument("--prompt-tokens", type=int, default=512)
    b.add_argument("--new-tokens", type=int, default=128)

    i = verbs.add_parser("info", help="model, recipe, memory per weight group and KV token, kernels")
    _add_model_args(i)
    i.add_argument("--plan", action="store_true", help="print the execution plan: per linear role and token "
                   "bucket, and per attention phase, the kernel and why; for an FMPQ (w4a4) model also the share "
                   "of int8 activation blocks of each linear, per layer")

    if _quantize_main() is not None:
        verbs.add_parser("quantize", help="quantize a checkpoint into a lowbit directory (see lowbit quantize -h)",
                         add_help=False)
    return parser


def _quantize_main():
    try:
        from .quantize.cli import main
    except ImportError:
        return None
    return main


def _kernel_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"--kernel must be ROLE=KERNEL or KNOB=VALUE, got {item!r}")
        out[key] = value
    return out


def _load(args):
    from .llm import LLM
    return LLM(args.model, recipe=args.recipe, device=args.device, dtype=args.dtype, num_threads=args.threads,
               progress=not args.quiet, gpu_memory_fraction=args.gpu_memory_fraction,
               cuda_graphs=not args.no_cuda_graphs, overlap_steps=not args.no_overlap,
               kernel_overrides=_kernel_overrides(args.kernel), strict=args.strict, load_format=args.load_format,
               tensor_parallel=args.tp)


def _sampling(args):
    from .generation import GenerationConfig
    return GenerationConfig(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                            presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                            seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)


def cmd_generate(args) -> int:
    cfg = _sampling(args)
    llm = _load(args)
    prompts = list(args.prompts) + list(args.prompt or []) or [DEFAULT_PROMPT]
    as_chat = not args.raw and bool(llm.tokenizer.chat_template)
    if as_chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], cfg)
    else:
        outs = llm.generate(prompts, cfg)
    for prompt, out in zip(prompts, outs):
        if len(prompts) > 1:
            print(f"--- {prompt}")
        print(out.text if as_chat else prompt + out.text)
        t = out.timings
        print(f"[{out.num_tokens} tokens, {out.finish_reason}, ttft {t.ttft_s * 1e3:.0f} ms, "
              f"{t.decode_tokens_per_s:.1f} tok/s]", file=sys.stderr)
    return 0


def cmd_chat(args, stdin=None, stdout=None) -> int:
    """Reads one user turn per line; a turn that fails (e.g. the conversation outgrew the context) is reported
    on stderr and the chat goes on."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    cfg = _sampling(args)
    llm = _load(args)
    with llm.session(args.system) as session:
        while True:
            stdout.write("> ")
            stdout.flush()
            line = stdin.readline()
            if not line or line.strip() == "/exit":
                stdout.write("\n")
                return 0
            if not line.strip():
                continue
            try:
                for piece in session.stream(line.rstrip("\n"), cfg):
                    stdout.write(piece)
                    stdout.flush()
            except ValueError as e:
                print(f"lowbit chat: error: {e}", file=sys.stderr)
            stdout.write("\n")


SERVE_EXTRA_HINT = "lowbit serve needs FastAPI, uvicorn and prometheus-client: pip install 'lowbit[serve]'"


def cmd_serve(args) -> int:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(f"lowbit serve: error: {SERVE_EXTRA_HINT} (missing {e.name})", file=sys.stderr)
        return 2
    if args.max_seqs < 1 or args.max_queue < 0:
        raise ValueError(f"--max-seqs must be >= 1 and --max-queue >= 0, got {args.max_seqs} and {args.max_queue}")
    from .llm import LLM
    from .serve import serve
    llm = LLM(args.model, recipe=args.recipe, device=args.device, dtype=args.dtype, num_threads=args.threads,
              progress=not args.quiet, gpu_memory_fraction=args.gpu_memory_fraction,
              cuda_graphs=not args.no_cuda_graphs, overlap_steps=not args.no_overlap,
              kernel_overrides=_kernel_overrides(args.kernel), strict=args.strict, max_seqs=args.max_seqs, kv_cache_memory=args.kv_cache_memory, step_thread=True,
              prefix_caching=not args.no_prefix_caching, load_format=args.load_format, tensor_parallel=args.tp)
    serve(llm, host=args.host, port=args.port, model_name=args.served_model_name, api_key=args.api_key,
          max_seqs=args.max_seqs, max_queue=args.max_queue, log_level=args.log_level)
    return 0


def cmd_perplexity(args) -> int:
    if args.window < 2:
        raise ValueError(f"--window must be >= 2, got {args.window}")
    if args.max_tokens < 2:
        raise ValueError(f"--max-tokens must be >= 2, got {args.max_tokens}")
    try:
        text = Path(args.text).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{args.text} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise ValueError(f"{args.text} holds no text")
    llm = _load(args)
    ppl = llm.perplexity(text, window=args.window, max_tokens=args.max_tokens)
    print(f"perplexity {ppl:.4f} ({llm.recipe}, window {args.window}, first {args.max_tokens} tokens of {args.text})")
    return 0


def cmd_bench(args) -> int:
    from .bench import run_bench
    if args.prompt_tokens < 1 or args.new_tokens < 2:
        raise ValueError(f"--prompt-tokens must be >= 1 and --new-tokens >= 2, got {args.prompt_tokens} and "
                         f"{args.new_tokens}")
    llm = _load(args)
    r = run_bench(llm, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens)
    print(f"{llm.recipe}: prefill {r['prefill_tok_s']:.1f} tok/s ({args.prompt_tokens} tokens), "
          f"decode {r['decode_tok_s']:.1f} tok/s ({args.new_tokens} new tokens)")
    return 0


def cmd_info(args) -> int:
    from .info import format_fmpq_blocks, format_info, format_plan
    llm = _load(args)
    info = llm.info()
    print(format_info(info))
    if args.plan:
        print(format_plan(llm.model.plan()))
        fractions = (info.get("quantization") or {}).get("fmpq_int8_block_fraction")
        if fractions:
            print(format_fmpq_blocks(fractions))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["quantize"] and _quantize_main() is not None:
        return _quantize_main()(argv[1:])
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the verb's parser: "lowbit generate: error: ..." like every other error
        verb_parser = parser._subparsers._group_actions[0].choices[args.verb]  # noqa: SLF001 - argparse has no API
        verb_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    handler = {"generate": cmd_generate, "chat": cmd_chat, "serve": cmd_serve, "perplexity": cmd_perplexity,
               "bench": cmd_bench, "info": cmd_info}[args.verb]
    try:
        return handler(args)
    except (ValueError, TypeError, OSError, NotImplementedError, MemoryError, ImportError) as e:
        # Bad input (model file, recipe, prompt, options): one line naming the problem, no traceback.
        print(f"lowbit {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
