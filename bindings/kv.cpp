// Paged KV: BlockAllocator (bookkeeping) and KVCache (per-layer block storage).
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings/bind.h"
#include "lowbit/kv/kv_cache.h"

namespace nb = nanobind;

namespace lowbit::bindings {
namespace {

KVCacheConfig make_config(int num_layers, int num_kv_heads, int head_dim, int64_t num_blocks, int block_size,
                          const std::string& k_type, const std::string& v_type, const std::string& device) {
  KVCacheConfig c;
  c.num_layers = num_layers;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.k_type = scalar_type_from_name(k_type);
  c.v_type = scalar_type_from_name(v_type);
  c.device = Device::parse(device);
  return c;
}

nb::object optional_tensor(const Tensor& t) { return t.defined() ? nb::cast(t) : nb::none(); }

}  // namespace

void bind_kv(nb::module_& m) {
  nb::class_<BlockAllocator>(m, "BlockAllocator",
                             "Paged KV bookkeeping: free pool, per-sequence block tables, shared prefixes "
                             "(reference counts) with copy-on-write, optional automatic prefix caching")
      .def(nb::init<int64_t, int, bool, uint64_t>(), nb::arg("num_blocks"), nb::arg("block_size") = 16,
           nb::arg("prefix_caching") = false, nb::arg("cache_seed") = 0)
      .def("create_sequence", &BlockAllocator::create_sequence)
      .def("fork", &BlockAllocator::fork, nb::arg("parent"), "New sequence sharing all of parent's blocks")
      .def("free_sequence", &BlockAllocator::free_sequence, nb::arg("seq"))
      .def("blocks_needed", &BlockAllocator::blocks_needed, nb::arg("seq"), nb::arg("n"))
      .def("can_append", &BlockAllocator::can_append, nb::arg("seq"), nb::arg("n"))
      .def(
          "append_tokens",
          [](BlockAllocator& a, SeqId seq, int64_t n) {
            std::vector<std::pair<int32_t, int32_t>> copies;
            const bool ok = a.append_tokens(seq, n, &copies);
            return std::make_pair(ok, copies);
          },
          nb::arg("seq"), nb::arg("n"),
          "Reserves room for n tokens. Returns (ok, copies): ok is False (nothing changed) when the pool "
          "is short; copies lists the (src_block, dst_block) copy-on-write copies the caller must perform "
          "(KVCache.copy_block)")
      .def("block_table", &BlockAllocator::block_table, nb::arg("seq"))
      .def("num_tokens", &BlockAllocator::num_tokens, nb::arg("seq"))
      .def("slot_of", &BlockAllocator::slot_of, nb::arg("seq"), nb::arg("token_index"))
      .def("has_sequence", &BlockAllocator::has_sequence, nb::arg("seq"))
      .def("ref_count", &BlockAllocator::ref_count, nb::arg("block"))
      .def("check_invariants", &BlockAllocator::check_invariants)
      .def(
          "adopt_cached_prefix",
          [](BlockAllocator& a, SeqId seq, const std::vector<int32_t>& tokens) {
            return a.adopt_prefix(seq, tokens, a.match_prefix(tokens));
          },
          nb::arg("seq"), nb::arg("tokens"),
          "Gives the empty sequence seq the cached blocks of tokens' longest cached prefix of full blocks "
          "(never the last token); returns how many tokens it now holds")
      .def("cache_computed_blocks", &BlockAllocator::cache_computed_blocks, nb::arg("seq"), nb::arg("tokens"),
           nb::arg("num_computed"), "Registers seq's full blocks among its first num_computed tokens")
      .def("is_cached", &BlockAllocator::is_cached, nb::arg("block"))
      .def_prop_ro("prefix_caching", &BlockAllocator::prefix_caching)
      .def(
          "prefix_cache_stats",
          [](const BlockAllocator& a) {
            const PrefixCacheStats s = a.prefix_cache_stats();
            nb::dict d;
            d["query_tokens"] = s.query_tokens;
            d["hit_tokens"] = s.hit_tokens;
            d["cached_blocks"] = s.cached_blocks;
            d["evictable_blocks"] = s.evictable_blocks;
            d["evictions"] = s.evictions;
            return d;
          },
          "Counters (query_tokens, hit_tokens, evictions) and gauges (cached_blocks, evictable_blocks)")
      .def_prop_ro("num_blocks", &BlockAllocator::num_blocks)
      .def_prop_ro("block_size", &BlockAllocator::block_size)
      .def_prop_ro("num_free_blocks", &BlockAllocator::num_free_blocks)
      .def_prop_ro("num_used_blocks", &BlockAllocator::num_used_blocks)
      .def_prop_ro("num_sequences", &BlockAllocator::num_sequences);

  nb::class_<KVCache>(m, "KVCache",
                      "Per-layer paged K/V storage: data [num_blocks, num_kv_heads, block_size, head_dim] "
                      "(u4/u2 packed two/four per byte), params f32 [..., 2] = (scale, zero) for u8/u4/u2; with "
                      "k_per_channel, K params are [num_blocks, num_kv_heads, 2, head_dim] (scales, zeros per channel "
                      "of the block) and partly filled blocks keep K in an f16 residual window")
      .def(
          "__init__",
          [](KVCache* self, int num_layers, int num_kv_heads, int head_dim, int64_t num_blocks, int block_size,
             const std::string& k_type, const std::string& v_type, const std::string& device, bool k_per_channel,
             int64_t k_window_slots) {
            KVCacheConfig c =
                make_config(num_layers, num_kv_heads, head_dim, num_blocks, block_size, k_type, v_type, device);
            c.k_per_channel = k_per_channel;
            c.k_window_slots = k_window_slots;
            new (self) KVCache(c);
          },
          nb::arg("num_layers"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("num_blocks"),
          nb::arg("block_size") = 16, nb::arg("k_type") = "f16", nb::arg("v_type") = "f16", nb::arg("device") = "cpu",
          nb::arg("k_per_channel") = false, nb::arg("k_window_slots") = 0)
      .def_prop_ro("k_per_channel", [](const KVCache& c) { return c.config().k_per_channel; })
      .def_prop_ro("num_layers", [](const KVCache& c) { return c.config().num_layers; })
      .def_prop_ro("num_kv_heads", [](const KVCache& c) { return c.config().num_kv_heads; })
      .def_prop_ro("head_dim", [](const KVCache& c) { return c.config().head_dim; })
      .def_prop_ro("num_blocks", [](const KVCache& c) { return c.config().num_blocks; })
      .def_prop_ro("block_size", [](const KVCache& c) { return c.config().block_size; })
      .def_prop_ro("k_type", [](const KVCache& c) { return std::string(name_of(c.config().k_type)); })
      .def_prop_ro("v_type", [](const KVCache& c) { return std::string(name_of(c.config().v_type)); })
      .def_prop_ro("device", [](const KVCache& c) { return c.config().device.str(); })
      .def("k_data", [](const KVCache& c, int l) { return c.k_data(l); }, nb::arg("layer"))
      .def("v_data", [](const KVCache& c, int l) { return c.v_data(l); }, nb::arg("layer"))
      .def("k_params", [](const KVCache& c, int l) { return optional_tensor(c.k_params(l)); }, nb::arg("layer"),
           "f32 [num_blocks, num_kv_heads, block_size, 2] (scale, zero), or None for float K")
      .def("v_params", [](const KVCache& c, int l) { return optional_tensor(c.v_params(l)); }, nb::arg("layer"))
      .def("copy_block", &KVCache::copy_block, nb::arg("src"), nb::arg("dst"))
      .def(
          "k_window",
          [](const KVCache& c, int l) { return c.has_k_window() ? optional_tensor(c.k_window(l)) : nb::none(); },
          nb::arg("layer"),
           "Per-channel K on a GPU: f16 [k_window_slots, num_kv_heads, block_size, head_dim], the window rows of "
           "partly filled blocks; None otherwise")
      .def_prop_ro(
          "k_window_map",
          [](const KVCache& c) { return c.has_k_window() ? optional_tensor(c.k_window_map()) : nb::none(); },
                   "Per-channel K on a GPU: s32 [num_blocks] window slot of each block (-1: none), on the device")
      .def_prop_ro("k_window_slots_in_use", [](const KVCache& c) { return c.k_window_slots().slots_in_use(); })
      .def_prop_ro("total_bytes", &KVCache::total_bytes)
      .def_static(
          "bytes_per_token",
          [](int num_layers, int num_kv_heads, int head_dim, const std::string& k_type, const std::string& v_type) {
            return KVCache::bytes_per_token(make_config(num_layers, num_kv_heads, head_dim, 1, 1, k_type, v_type, "cpu"));
          },
          nb::arg("num_layers"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("k_type") = "f16",
          nb::arg("v_type") = "f16", "Bytes one token costs across all layers (data + params)");
}

}  // namespace lowbit::bindings
