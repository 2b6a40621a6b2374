"""Tensor storage and DLPack exchange with torch and numpy (zero-copy, both ways)."""
import gc

import numpy as np
import pytest

import lowbit

torch = pytest.importorskip("torch")


def test_torch_to_lowbit_shares_memory():
    t = torch.randn(5, 7)
    x = lowbit.from_dlpack(t)
    assert x.shape == (5, 7) and x.dtype == "f32" and x.device == "cpu"
    back = torch.from_dlpack(x)
    back[2, 3] = 123.5
    assert t[2, 3].item() == 123.5  # writes through lowbit's view reach the torch tensor
    t[0, 0] = -7.25
    assert back[0, 0].item() == -7.25


def test_lowbit_to_torch_shares_memory_and_outlives_owner():
    x = lowbit.empty([3, 4], "f32")
    t = torch.from_dlpack(x)
    t.copy_(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    del x
    gc.collect()
    assert torch.equal(t, torch.arange(12, dtype=torch.float32).reshape(3, 4))  # storage kept alive by torch


def test_lowbit_view_outlives_torch_tensor():
    t = torch.randn(64, 33)
    expected = t.clone()
    x = lowbit.from_dlpack(t)
    del t
    gc.collect()
    assert torch.equal(torch.from_dlpack(x), expected)


def test_strided_views_round_trip():
    t = torch.randn(6, 10)[:, 2:9]  # non-contiguous
    x = lowbit.from_dlpack(t)
    assert x.shape == (6, 7) and x.strides == (10, 1) and not x.is_contiguous()
    assert torch.equal(torch.from_dlpack(x), t)
    c = x.contiguous()
    assert c.is_contiguous() and torch.equal(torch.from_dlpack(c), t)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "f16"), (torch.bfloat16, "bf16"), (torch.int8, "s8"),
                                        (torch.uint8, "u8"), (torch.int32, "s32"), (torch.int64, "s64"),
                                        (torch.float8_e4m3fn, "e4m3")])
def test_dtypes_map(dtype, name):
    t = (torch.randn(4, 5) * 10).to(dtype)
    x = lowbit.from_dlpack(t)
    assert x.dtype == name
    assert torch.equal(torch.from_dlpack(x).view(torch.uint8), t.view(torch.uint8))


def test_numpy_both_ways():
    a = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    x = lowbit.from_dlpack(a)
    b = np.from_dlpack(x)
    b[1, 1] = 42.0
    assert a[1, 1] == 42.0


def test_sub_byte_tensor_exports_bytes():
    x = lowbit.empty([4, 10], "u4")
    assert x.nbytes == 20
    t = torch.from_dlpack(x)
    assert t.dtype == torch.uint8 and tuple(t.shape) == (4, 5)


def test_clear_errors():
    with pytest.raises(TypeError, match="expected a lowbit.Tensor or an object supporting DLPack"):
        lowbit.from_dlpack([1, 2, 3])
    with pytest.raises(TypeError, match="unknown scalar type 'f13'"):
        lowbit.empty([2], "f13")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        lowbit.empty([2], "f32", "tpu")
    with pytest.raises(TypeError, match="unsupported DLPack dtype"):
        lowbit.from_dlpack(torch.zeros(2, dtype=torch.complex64))


def test_cuda_unavailable_is_a_clear_error():
    if lowbit.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises((RuntimeError, NotImplementedError), match="cuda:0 requested"):
        lowbit.empty([2], "f32", "cuda")


def test_allocator_stats_track_live_bytes():
    before = lowbit.allocator_stats("cpu")["allocated_bytes"]
    x = lowbit.empty([1000], "f32")
    assert lowbit.allocator_stats("cpu")["allocated_bytes"] - before == 4000
    del x
    gc.collect()
    assert lowbit.allocator_stats("cpu")["allocated_bytes"] == before
