"""CUDA tensors: DLPack exchange with torch (zero-copy both ways, lifetimes) and the caching allocator.

Skipped without a GPU; tools/gpu_run.sh runs it on the device."""
import gc

import pytest

import lowbit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (lowbit.cuda_available() and torch.cuda.is_available()),
                                reason="needs a CUDA GPU visible to both lowbit and torch")


def test_torch_cuda_to_lowbit_shares_memory():
    t = torch.randn(5, 7, device="cuda")
    x = lowbit.from_dlpack(t)
    assert x.shape == (5, 7) and x.dtype == "f32" and x.device == "cuda:0"
    back = torch.from_dlpack(x)
    assert back.device.type == "cuda" and back.data_ptr() == t.data_ptr()
    back[2, 3] = 123.5
    torch.cuda.synchronize()
    assert t[2, 3].item() == 123.5  # a write through lowbit's view reaches the torch tensor
    t[0, 0] = -7.25
    assert back[0, 0].item() == -7.25


def test_lowbit_cuda_tensor_outlives_its_owner_in_torch():
    x = lowbit.empty([3, 40], "f16", "cuda")
    t = torch.from_dlpack(x)
    assert t.device.type == "cuda" and t.dtype == torch.float16
    src = torch.randn(3, 40, device="cuda").half()
    t.copy_(src)
    del x
    gc.collect()
    assert torch.equal(t, src)  # torch keeps lowbit's storage alive


def test_lowbit_view_outlives_torch_cuda_tensor():
    t = torch.randn(64, 33, device="cuda")
    expected = t.clone()
    x = lowbit.from_dlpack(t)
    del t
    gc.collect()
    torch.cuda.empty_cache()
    assert torch.equal(torch.from_dlpack(x), expected)


def test_copies_between_host_and_device_round_trip():
    t = torch.randn(17, 9)
    x = lowbit.from_dlpack(t)
    on_gpu = x.to("cuda")
    assert on_gpu.device == "cuda:0"
    assert torch.equal(torch.from_dlpack(on_gpu).cpu(), t)
    back = on_gpu.to("cpu")
    assert torch.equal(torch.from_dlpack(back), t)


def test_caching_allocator_reuses_freed_blocks():
    lowbit.empty([1 << 20], "f32", "cuda")  # warm the cache with a 4 MiB block (freed at once)
    gc.collect()
    before = lowbit.allocator_stats("cuda")
    x = lowbit.empty([1 << 20], "f32", "cuda")
    during = lowbit.allocator_stats("cuda")
    assert during["allocated_bytes"] - before["allocated_bytes"] >= 4 << 20
    assert during["num_system_allocs"] == before["num_system_allocs"]  # served from the cache, no cudaMalloc
    del x
    gc.collect()
    after = lowbit.allocator_stats("cuda")
    assert after["allocated_bytes"] == before["allocated_bytes"]
    assert after["reserved_bytes"] >= after["allocated_bytes"]


def test_empty_cache_returns_the_free_blocks_and_keeps_the_live_ones():
    live = lowbit.from_dlpack(torch.arange(1 << 18, dtype=torch.float32)).to("cuda")  # 1 MiB in use
    lowbit.empty([3 << 20], "f32", "cuda")  # 12 MiB, freed at once: cached
    gc.collect()
    cached = lowbit.allocator_stats("cuda")
    assert cached["reserved_bytes"] - cached["allocated_bytes"] >= 12 << 20
    released = lowbit.empty_cache("cuda")
    after = lowbit.allocator_stats("cuda")
    assert released >= 12 << 20 and after["reserved_bytes"] == cached["reserved_bytes"] - released
    assert after["allocated_bytes"] == cached["allocated_bytes"]
    assert torch.equal(torch.from_dlpack(live.to("cpu")), torch.arange(1 << 18, dtype=torch.float32))
