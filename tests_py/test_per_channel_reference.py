"""The float64 per-channel K reference of the GPU prefill tests (per_channel_ref.py) against the CPU cache's attention,
which defines the format and its window rule: chunked prefill over a cached prefix, blocks sealed inside the chunk,
a one-token chunk at a block's last key, GQA, 4- and 2-bit K, every V type. A wrong window rule, block boundary or
unpacking in the reference moves outputs by ~0.1; the CPU computes in f32 from the same codes (~1e-6)."""
import pytest
import torch

from per_channel_ref import per_channel_case


@pytest.mark.parametrize("kt,vt,d,bs,hq,hkv", [("u4", "u4", 64, 32, 8, 2), ("u2", "u8", 64, 48, 6, 3),
                                               ("u4", "f16", 128, 16, 4, 4), ("u2", "u2", 128, 64, 8, 1)])
def test_reference_matches_the_cpu_cache(kt, vt, d, bs, hq, hkv):
    prefix, chunk = [0, 70, bs - 1, 2 * bs + 5], [37, 100, 1, 3 * bs]
    out, ref, inside = per_channel_case(prefix, chunk, hq, hkv, d, kt, vt, bs, seed=d + bs, device="cpu",
                                        q_dtype=torch.float32)
    err = (out[inside].double() - ref[inside]).abs().max() / ref[inside].abs().max()
    assert err < 1e-5, err
