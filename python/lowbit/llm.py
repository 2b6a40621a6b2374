"""lowbit.LLM: load a model, build the C++ engine, and generate, chat, stream, score."""
from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

from .driver import EngineDriver
from .generation import GenerationConfig, resolve_config
from .outputs import RequestOutput

Prompt = str | bytes | Sequence[int]


class LLM:
    """A model served by lowbit's continuous-batching engine.

        llm = lowbit.LLM()                       # SmolLM2-135M-Instruct, f32 weights
        llm.generate("The capital of France is", max_tokens=16)[0].text
        llm.chat([{"role": "user", "content": "Hi!"}])[0].text

    step_thread=True runs the engine's step loop on a background thread: generate/chat/stream/session calls
    from several Python threads are then batched together, and a stream's consumer runs while the next step
    computes. Call close() (or use `with lowbit.LLM(...) as llm:`) to stop the thread.

    tensor_parallel=N shards the model over N ranks (Megatron-style: attention heads, MLP channels and the vocabulary
    split, two all-reduces per layer): on GPUs one rank per device cuda:i..cuda:i+N-1 over NCCL, on the CPU N threads.
    tensor_parallel_backend="threads" keeps every rank on one device (sharded math on one GPU, for tests).

    load_format="random": `model` is a directory with config.json (and optionally tokenizer.json); its weights are
    drawn at random (models/random_weights.py), for benchmarks of a model's shape. Without a tokenizer, prompts
    are token ids and token i decodes as "<i>".
    """

    def __init__(self, model: str | os.PathLike | None = None, recipe: str | None = None, device: str = "cpu",
                 dtype: str | None = None, max_batch_tokens: int = 2048, max_seqs: int = 64,
                 kv_cache_memory: int | None = None, block_size: int = 16, num_threads: int | None = None,
                 progress: bool = True, step_thread: bool = False, gpu_memory_fraction: float = 0.9,
                 cuda_graphs: bool = True, overlap_steps: bool = True, kernel_overrides: dict[str, str] | None = None,
                 strict: bool = False, prefix_caching: bool = True, load_format: str = "auto",
                 tensor_parallel: int = 1, tensor_parallel_backend: str = "auto") -> None:
        from . import _core
        from .model_loading import build_model, resolve_recipe, use_stored_quantization
        from .models import load_model_source

        if kv_cache_memory is not None and (not isinstance(kv_cache_memory, int) or kv_cache_memory <= 0):
            raise ValueError(f"LLM: kv_cache_memory must be a positive number of bytes or None, got {kv_cache_memory!r}")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads <= 0):
            raise ValueError(f"LLM: num_threads must be a positive integer or None, got {num_threads!r}")
        if not isinstance(overlap_steps, bool):
            raise ValueError(f"LLM: overlap_steps must be True or False, got {overlap_steps!r}")
        if not isinstance(prefix_caching, bool):
            raise ValueError(f"LLM: prefix_caching must be True or False, got {prefix_caching!r}")
        if not isinstance(tensor_parallel, int) or isinstance(tensor_parallel, bool) or tensor_parallel < 1:
            raise ValueError(f"LLM: tensor_parallel must be a positive integer, got {tensor_parallel!r}")
        if not isinstance(gpu_memory_fraction, (int, float)) or not 0 < gpu_memory_fraction <= 1:
            raise ValueError(f"LLM: gpu_memory_fraction must be in (0, 1], got {gpu_memory_fraction!r}")
        try:  # fail fast, before the model is read
            _core.parse_recipe(recipe or "w16a16")
        except ValueError as e:
            raise ValueError(f"LLM: unknown recipe {recipe!r}: {e}") from None
        if dtype is None:  # the GPU kernels compute in f16; the CPU's reference precision is f32
            dtype = "f16" if str(device).startswith("cuda") else "f32"
        self._driver: EngineDriver | None = None
        loaded = load_model_source(model, progress=progress, load_format=load_format, device=device)
        # GGUF: Q4_0/Q4_1/Q8_0 kept as stored; no recipe: the file's own precision
        recipe = use_stored_quantization(loaded, recipe, device, progress, dtype)
        recipe = resolve_recipe(loaded, recipe)  # None: w16a16, or a quantized directory's own
        from .models.gguf_report import tensor_report
        self.tensor_report = tensor_report(loaded, recipe, dtype)  # GGUF: what each tensor became (lowbit info)
        self.source = loaded.source
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.generation_defaults = dict(loaded.generation_defaults)
        self.checkpoint_manifest = getattr(loaded, "manifest", None)  # a quantized checkpoint's (lowbit info)
        self.load_note = getattr(loaded, "load_note", None)  # what the loader did with stored quant types
        self.recipe, self.device, self.dtype = recipe, device, dtype
        if kernel_overrides is not None and not isinstance(kernel_overrides, dict):
            raise ValueError(f"LLM: kernel_overrides must be a dict of str to str, got {kernel_overrides!r}")
        built = build_model(loaded, recipe, device, dtype, progress, kernel_overrides=kernel_overrides, strict=strict,
                            tensor_parallel=tensor_parallel, tensor_parallel_backend=tensor_parallel_backend)
        self.models = built if isinstance(built, list) else [built]  # the tensor-parallel ranks, in rank order
        self.model = self.models[0]
        self.tensor_parallel = len(self.models)
        self.num_parameters = loaded.num_parameters()
        del loaded  # float tensors are no longer needed: the C++ model holds packed copies
        self.engine = _core.Engine(self.models if self.tensor_parallel > 1 else self.model,
                                   max_batch_tokens=max_batch_tokens, max_seqs=max_seqs,
                                   block_size=block_size, kv_cache_bytes=kv_cache_memory or 0,
                                   num_threads=num_threads or 0, gpu_memory_fraction=float(gpu_memory_fraction),
                                   cuda_graphs=bool(cuda_graphs), prefix_caching=prefix_caching,
                                   overlap_steps=overlap_steps)
        eos = list(self.config.eos_token_ids) or list(self.tokenizer.eos_token_ids)
        self._driver = EngineDriver(self.engine, self.tokenizer, eos, step_thread=step_thread)
        self._next_session = 0

    # ------------------------------------------------------------------ prompts
    def _prompt_ids(self, prompt: Prompt, index: int, config: GenerationConfig) -> tuple[str | None, list[int]]:
        where = f"prompt {index}"
        if isinstance(prompt, (bytes, bytearray)):
            try:
                prompt = bytes(prompt).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: bytes are not valid UTF-8 ({e.reason} at byte {e.start})") from None
        if isinstance(prompt, str):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"{where}: text is not valid UTF-8 ({e.reason} at index {e.start})") from None
            if not prompt:
                raise ValueError(f"{where}: empty prompt")
            text, ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=config.add_special_tokens)
        else:
            try:
                text, ids = None, list(prompt)
            except TypeError:
                raise TypeError(f"{where}: expected str, bytes or a list of int token ids, "
                                f"got {type(prompt).__name__}") from None
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise TypeError(f"{where}: expected str, bytes or a list of int token ids")
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"{where}: token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        if not ids:
            raise ValueError(f"{where}: the prompt encodes to no tokens")
        limit = self.config.max_position_embeddings
        if len(ids) + config.max_tokens > limit:
            raise ValueError(f"{where}: {len(ids)} prompt tokens + max_tokens {config.max_tokens} exceed the "
                             f"model's context of {limit} tokens")
        return text, ids

    def _normalize_prompts(self, prompts: Any) -> list[Prompt]:
        if isinstance(prompts, (str, bytes, bytearray)):
            return [prompts]
        try:
            prompts = list(prompts)
        except TypeError:
            raise TypeError(f"generate: expected a prompt (str, bytes, token ids) or a list of prompts, "
                            f"got {type(prompts).__name__}") from None
        if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
            return [prompts]  # one prompt given as token ids
        if not prompts:
            raise ValueError("generate: no prompts given")
        return prompts

    def _run(self, pairs: list[tuple[str | None, list[int]]], config: GenerationConfig) -> list[RequestOutput]:
        states = []
        try:
            for text, ids in pairs:
                states.append(self._driver.submit(text, ids, config))
            self._driver.run_until_done(states)
        except BaseException:
            for s in states:  # leave the engine serving others: drop this call's requests
                self._driver.abort(s)
            raise
        return [s.output() for s in states]

    # ------------------------------------------------------------------ public API
    def generate(self, prompts: Prompt | list[Prompt], config: GenerationConfig | None = None,
                 **overrides: Any) -> list[RequestOutput]:
        """Generate for one prompt or a batch (str, UTF-8 bytes, or token ids), batched by the engine."""
        cfg = resolve_config(config, overrides)
        pairs = [self._prompt_ids(p, i, cfg) for i, p in enumerate(self._normalize_prompts(prompts))]
        return self._run(pairs, cfg)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.tokenizer.encode_chat(messages, add_generation_prompt=True)

    def chat(self, conversations: list[dict[str, str]] | list[list[dict[str, str]]],
             config: GenerationConfig | None = None, **overrides: Any) -> list[RequestOutput]:
        """Reply to one conversation (a list of {"role", "content"}) or a batch of them, via the chat template."""
        cfg = resolve_config(config, overrides)
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        if not conversations:
            raise ValueError("chat: no conversations given")
        pairs = []
        for i, conv in enumerate(conversations):
            _check_messages(conv, i)
            text = self.tokenizer.apply_chat_template(conv, add_generation_prompt=True)
            pairs.append((text, self._prompt_ids(self.chat_ids(conv), i, cfg)[1]))
        return self._run(pairs, cfg)

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None, **overrides: Any) -> Iterator[str]:
        """Yields text pieces as tokens arrive (never half a UTF-8 character, never part of a stop string)."""
        cfg = resolve_config(config, overrides)
        text, ids = self._prompt_ids(prompt, 0, cfg)
        yield from self._stream_ids(text, ids, cfg)

    def _stream_ids(self, text: str | None, ids: list[int], cfg: GenerationConfig, session_id: int = -1,
                    result: list | None = None) -> Iterator[str]:
        driver = self._driver
        state = driver.submit(text, ids, cfg, session_id)
        try:
            while True:
                with driver.locked():
                    delta, finished, error = state.take_stream_delta(), state.finished, state.error
                if error is not None:
                    raise error
                if delta:
                    yield delta
                if finished:
                    break
                driver.wait([state], until=lambda: state.finished or state.safe_text_end() > state.streamed)
        finally:
            self._driver.abort(state)  # no-op when it finished; frees the KV when the caller stopped early
            if result is not None:
                result.append(state.output())

    def session(self, system: str | None = None) -> "Session":
        """A multi-turn conversation that keeps its KV cache in the engine between turns."""
        from .session import Session
        self._next_session += 1
        return Session(self, self._next_session, system)

    def perplexity(self, text: str, window: int = 1024, max_tokens: int = 4096) -> float:
        """exp(mean NLL) over the first max_tokens tokens of text, in non-overlapping windows."""
        from .perplexity import perplexity
        return perplexity(self, text, window=window, max_tokens=max_tokens)

    def logits(self, prompt_ids: list[int]):
        """f32 [T, vocab] logits of every position (numpy)."""
        import numpy as np
        ids = list(prompt_ids)
        return np.from_dlpack(self._driver.call(lambda: self.engine.logits(ids)))

    def stats(self) -> dict[str, int | float | bool]:
        """The engine's counters: KV blocks, running/waiting requests, sessions, prefilled and generated tokens,
        and prefix caching (prefix_caching, prefix_cache_query_tokens / _hit_tokens / _hit_rate, _blocks,
        _evictions; see docs/usage.md)."""
        return dict(self._driver.call(self.engine.stats))

    def close(self) -> None:
        """Stops the step thread (if any); the LLM is unusable afterwards only in step-thread mode."""
        if self._driver is not None:
            self._driver.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def info(self) -> dict[str, Any]:
        from .info import model_info
        return model_info(self)


def _check_messages(conv: Any, index: int) -> None:
    if not isinstance(conv, list) or not conv:
        raise ValueError(f"conversation {index}: expected a non-empty list of messages")
    for j, m in enumerate(conv):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"conversation {index}, message {j}: expected a dict with 'role' and 'content', got {m!r}")
