"""Two engines on one GPU, each stepped by its own Python thread (Engine.step releases the GIL): their eager decode
steps launch the same kernels at the same time with different shapes. The one-token GEMVs size their shared memory
per launch (their copy of x grows with k), and a kernel's shared-memory limit is one value per device, so the
limit is only ever raised (cuda/smem_limit.h); each engine must make exactly what it makes alone."""
import threading

import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_engine import random_llama

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

SHAPES = [dict(hidden=256, inter=320), dict(hidden=512, inter=1536)]  # different k: different GEMV shared memory


def decode(eng, prompt, tokens):
    eng.add_request(0, prompt, temperature=0.0, max_tokens=tokens)
    out = []
    while eng.has_unfinished():
        out += [ev.token for ev in eng.step() if ev.token >= 0]
    return out


@pytest.mark.parametrize("recipe", ["w4a8kv8", "w4a16kv8"])
def test_two_engines_in_two_threads_on_one_gpu(recipe):
    models = [random_llama(recipe, "cuda", "f16", seed=20 + i, embed_scale=0.05, **shape)
              for i, shape in enumerate(SHAPES)]
    prompts = [torch.randint(0, 1000, (9,), generator=torch.Generator().manual_seed(30 + i)).tolist() for i in (0, 1)]
    # eager steps: every step launches its kernels (and sets their limits) from the host
    engines = [_core.Engine(m, max_batch_tokens=64, cuda_graphs=False) for m in models]
    alone = [decode(e, p, 240) for e, p in zip(engines, prompts)]
    together, errors = [None, None], []

    def run(i):
        try:
            together[i] = decode(engines[i], prompts[i], 240)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert together == alone
