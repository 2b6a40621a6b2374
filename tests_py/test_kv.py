"""Paged KV from Python: BlockAllocator bookkeeping and KVCache storage exposed to torch."""
import pytest

torch = pytest.importorskip("torch")
from lowbit import _core as lb  # noqa: E402


def test_allocator_append_fork_copy_on_write():
    a = lb.BlockAllocator(num_blocks=6, block_size=4)
    p = a.create_sequence()
    assert a.append_tokens(p, 6) == (True, [])
    assert a.block_table(p) == [0, 1]
    assert a.slot_of(p, 5) == 1 * 4 + 1
    c = a.fork(p)
    assert a.block_table(c) == [0, 1] and a.ref_count(0) == 2 and a.num_free_blocks == 4
    ok, copies = a.append_tokens(c, 1)
    assert ok and copies == [(1, a.block_table(c)[1])] and a.block_table(c)[1] != 1
    a.check_invariants()
    a.free_sequence(p)
    a.free_sequence(c)
    assert a.num_free_blocks == 6 and a.num_sequences == 0
    a.check_invariants()


def test_allocator_exhaustion_is_recoverable():
    a = lb.BlockAllocator(2, 4)
    s = a.create_sequence()
    assert a.append_tokens(s, 8) == (True, [])
    assert not a.can_append(s, 1)
    assert a.append_tokens(s, 1) == (False, [])
    assert a.num_tokens(s) == 8 and a.num_used_blocks == 2


def test_allocator_errors_name_the_sequence():
    a = lb.BlockAllocator(2, 4)
    with pytest.raises(IndexError, match="unknown sequence id 17"):
        a.append_tokens(17, 1)
    with pytest.raises(IndexError, match="unknown sequence id 3"):
        a.free_sequence(3)
    s = a.create_sequence()
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        a.append_tokens(s, -1)
    with pytest.raises(ValueError, match="'num_blocks' must be in"):
        lb.BlockAllocator(0, 4)


@pytest.mark.parametrize("k_type,v_type", [("f16", "bf16"), ("u8", "u4"), ("u4", "f32")])
def test_cache_storage_is_visible_to_torch(k_type, v_type):
    cache = lb.KVCache(num_layers=2, num_kv_heads=3, head_dim=64, num_blocks=5, block_size=16, k_type=k_type,
                       v_type=v_type)
    assert (cache.k_type, cache.v_type, cache.num_blocks, cache.block_size) == (k_type, v_type, 5, 16)
    bytes_per_elem = {"f32": 4, "f16": 2, "bf16": 2, "u8": 1, "u4": 0.5}
    expect = 0
    for t in (k_type, v_type):
        expect += 2 * 3 * (int(64 * bytes_per_elem[t]) + (8 if t in ("u8", "u4") else 0))
    assert lb.KVCache.bytes_per_token(2, 3, 64, k_type, v_type) == expect
    assert cache.total_bytes == expect * 5 * 16
    for layer in range(2):
        k = cache.k_data(layer)
        assert k.shape == (5, 3, 16, 64) and k.dtype == k_type
        raw = torch.from_dlpack(k.view_as_bytes())
        assert raw.numel() == int(5 * 3 * 16 * 64 * bytes_per_elem[k_type])
        params = cache.k_params(layer)
        assert (params is None) == (k_type not in ("u8", "u4"))
        if params is not None:
            assert torch.from_dlpack(params).shape == (5, 3, 16, 2)
    # copy_block reaches the storage torch sees.
    v = torch.from_dlpack(cache.v_data(1).view_as_bytes()).view(5, -1)
    v[2] = torch.randint(0, 255, v[2].shape, dtype=torch.uint8)
    cache.copy_block(2, 4)
    assert torch.equal(v[4], v[2])


def test_cache_config_errors():
    with pytest.raises(TypeError, match="v_type must be one of f32, f16, bf16, u8, u4, u2; got s8"):
        lb.KVCache(1, 1, 64, 4, v_type="s8")
    with pytest.raises(ValueError, match="'head_dim' must be positive, got 0"):
        lb.KVCache(1, 1, 0, 4)
    with pytest.raises(ValueError, match="packs 2 values per byte and needs head_dim divisible by 2, got 65"):
        lb.KVCache(1, 1, 65, 4, k_type="u4")
    cache = lb.KVCache(1, 1, 64, 4)
    with pytest.raises(IndexError, match="'dst' = 9 out of range"):
        cache.copy_block(0, 9)


def test_allocator_prefix_cache_from_python():
    a = lb.BlockAllocator(num_blocks=6, block_size=4, prefix_caching=True, cache_seed=3)
    assert a.prefix_caching
    tokens = list(range(10))
    s = a.create_sequence()
    assert a.adopt_cached_prefix(s, tokens) == 0  # nothing cached yet
    assert a.append_tokens(s, 10) == (True, [])
    a.cache_computed_blocks(s, tokens, 10)
    first_blocks = a.block_table(s)[:2]
    assert [a.is_cached(b) for b in a.block_table(s)] == [True, True, False]
    a.free_sequence(s)
    assert a.num_free_blocks == 6  # cached blocks no sequence holds are free
    t = a.create_sequence()
    assert a.adopt_cached_prefix(t, tokens[:8] + [99]) == 8
    assert a.block_table(t) == first_blocks and a.ref_count(first_blocks[0]) == 1
    assert a.prefix_cache_stats() == {"query_tokens": 19, "hit_tokens": 8, "cached_blocks": 2,
                                      "evictable_blocks": 0, "evictions": 0}
    a.check_invariants()
    with pytest.raises(ValueError, match="num_computed"):
        a.cache_computed_blocks(t, tokens, 9)
    assert not lb.BlockAllocator(4, 4).prefix_caching
