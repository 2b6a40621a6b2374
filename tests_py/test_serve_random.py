"""`--load-format random`: a directory with only config.json becomes a model of that shape with random weights,
served by a real `lowbit serve` process to the official `openai` client. Without a tokenizer, prompts are token
ids and token i reads "<i>" (so tools/bench_serving.py's random token-id prompts work end to end); a text prompt
or a chat gets a 400 that says to send token ids. Greedy output through the server equals lowbit.LLM loading the
same directory. Runs on the CPU, and on the GPU too when there is one."""
import re
import subprocess
import sys

import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client", "openai", "httpx", "torch"):
    pytest.importorskip(_module, reason="the serve extras, test clients and torch: pip install 'lowbit[serve]' "
                                        "openai httpx torch")

import httpx  # noqa: E402
import openai  # noqa: E402

import lowbit  # noqa: E402
from test_serve import _server_process  # noqa: E402
from tiny_random_model import write_config  # noqa: E402

MODEL = "tiny-random"
DEVICES = ["cpu"] + (["cuda"] if lowbit.cuda_available() else [])
# The server and the reference LLM share one GPU with whatever the test process already holds (other GPU tests'
# cached blocks): a fixed KV pool, not a share of the free memory, keeps the server independent of that.
GPU_KV_BYTES = 64 << 20
PROMPTS = [[5, 6, 7, 8] * 6, list(range(100, 137))]


def _device_args(device: str) -> list[str]:
    return ["--device", device] + (["--kv-cache-memory", str(GPU_KV_BYTES)] if device != "cpu" else [])


@pytest.fixture(scope="module", params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("tiny_random"))


@pytest.fixture(scope="module")
def llm(model_dir, device):
    extra = {"kv_cache_memory": GPU_KV_BYTES} if device != "cpu" else {}
    with lowbit.LLM(model_dir, load_format="random", device=device, progress=False, **extra) as m:
        yield m


@pytest.fixture(scope="module")
def server(model_dir, device):
    with _server_process("--model", model_dir, "--load-format", "random", "--served-model-name", MODEL,
                         *_device_args(device)) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=120)


def test_token_id_prompt_equals_llm(client, llm):
    ref = llm.generate(PROMPTS[0], max_tokens=8, ignore_eos=True)[0]
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == ref.text == " ".join(f"<{t}>" for t in ref.token_ids)
    assert r.usage.prompt_tokens == len(PROMPTS[0]) and r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"


def test_batch_of_token_id_prompts(client, llm, device):
    refs = [o.text for o in llm.generate(PROMPTS, max_tokens=5, ignore_eos=True)]
    r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert all(re.fullmatch(r"<\d+>( <\d+>){4}", t) for t in texts), texts
    if device == "cpu":
        # The server may step between the two submits, so the batches differ from LLM.generate's; the f32 CPU
        # kernels give the same argmax either way, the f16 GPU ones need not over random weights' near ties.
        assert texts == refs


def test_stream_has_text_in_every_chunk(client, llm):
    """What tools/bench_serving.py needs: each generated token arrives as visible text, usage at the end."""
    ref = llm.generate(PROMPTS[1], max_tokens=6, ignore_eos=True)[0]
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=6, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        if chunk.usage:
            usage = chunk.usage
    texts = [p for p in pieces if p]  # one token each, unless the engine ran ahead of the HTTP side
    assert "".join(texts) == ref.text and all(re.fullmatch(r"( ?<\d+>)+", t) for t in texts), texts
    assert usage.completion_tokens == 6 and usage.prompt_tokens == len(PROMPTS[1])


def test_text_of_token_ids_is_a_prompt(client, llm):
    """A completion's text can be sent back as a prompt."""
    text = " ".join(f"<{t}>" for t in PROMPTS[0])
    r = client.completions.create(model=MODEL, prompt=text, max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == llm.generate(PROMPTS[0], max_tokens=4, ignore_eos=True)[0].text


def test_text_and_chat_without_tokenizer_are_400(server):
    with httpx.Client(base_url=server, timeout=60) as http:
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hello there", "max_tokens": 4})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "no tokenizer" in err["message"] and "token ids" in err["message"] and err["param"] == "prompt"
        r = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4,
                                                    "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 400 and "no tokenizer" in r.json()["error"]["message"], r.text
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": [5, 1024], "max_tokens": 4})
        assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"], r.text
        assert http.get("/health").status_code == 200  # and it goes on serving


# ------------------------------------------------------------------ loading, without a server
def test_weights_are_seeded_and_finite(model_dir):
    a = lowbit.LLM(model_dir, load_format="random", progress=False)
    b = lowbit.LLM(model_dir, load_format="random", progress=False)
    la, lb = a.logits(PROMPTS[1]), b.logits(PROMPTS[1])
    assert (la == lb).all() and abs(la).max() > 0
    import numpy as np
    assert np.isfinite(la).all()
    assert a.num_parameters == 1024 * 128 * 2 + 2 * (128 * (128 + 64 + 64 + 128) + 3 * 128 * 256 + 2 * 128) + 128


@pytest.mark.parametrize("recipe", ["w4a16", "w4a8kv4", "w8a8kv8"])
def test_quantized_recipes_quantize_random_weights(model_dir, recipe):
    m = lowbit.LLM(model_dir, load_format="random", recipe=recipe, progress=False)
    out = m.generate(PROMPTS[0], max_tokens=4, ignore_eos=True)[0]
    assert m.recipe == recipe and len(out.token_ids) == 4


def test_directory_tokenizer_is_used(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<unk>", "hello", "world", "again"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory = write_config(tmp_path / "with_tokenizer")
    tok.save(str(tmp_path / "with_tokenizer" / "tokenizer.json"))
    m = lowbit.LLM(directory, load_format="random", progress=False)
    assert m.tokenizer.encode("hello world again") == [1, 2, 3]
    assert len(m.generate("hello world", max_tokens=3, ignore_eos=True)[0].token_ids) == 3


def _serve_error(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "lowbit", "serve", "--port", "1", *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    return proc.stderr


def test_errors_name_the_problem(tmp_path, model_dir):
    (tmp_path / "empty").mkdir()
    assert "no config.json" in _serve_error("--model", str(tmp_path / "empty"), "--load-format", "random")
    assert "invalid choice: 'dummy'" in _serve_error("--model", model_dir, "--load-format", "dummy")
    assert "--load-format random" in _serve_error("--model", model_dir)  # no weights: the hint names the flag
    with pytest.raises(ValueError, match="unknown load format 'dummy'"):
        lowbit.LLM(model_dir, load_format="dummy", progress=False)
    with pytest.raises(FileNotFoundError, match="needs a model directory"):
        lowbit.LLM(str(tmp_path / "missing"), load_format="random", progress=False)


def test_tensor_parallel_server_equals_one_rank(model_dir, llm, device):
    """`lowbit serve --tp 2` (2 heads, 1 KV head replicated; on GPUs with NCCL, else two CPU threads) answers what
    one rank computes."""
    import torch
    from lowbit import _core
    if device != "cpu" and not (_core.nccl_available()[0] and torch.cuda.device_count() >= 2):
        pytest.skip("tensor parallelism on GPUs needs 2 GPUs and NCCL")
    refs = [o.text for o in llm.generate(PROMPTS, max_tokens=6, ignore_eos=True)]
    with _server_process("--model", model_dir, "--load-format", "random", "--served-model-name", MODEL, "--tp", "2",
                         *_device_args(device)) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        r = c.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert [choice.text for choice in sorted(r.choices, key=lambda ch: ch.index)] == refs
