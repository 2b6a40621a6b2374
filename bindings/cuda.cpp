// GPU entry points and device info, plus the sm80 weight packer (host code, usable without a GPU).
// Sub-byte tensors arrive from torch as uint8 bytes (two u4 per byte, low nibble first) and are
// viewed as u4 here. `stream` is a cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "bindings/bind.h"
#include "bindings/tensor_arg.h"
#include "lowbit/quant/pack.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"
#endif

namespace nb = nanobind;

namespace lowbit::bindings {
namespace {

Tensor as_u4(const Tensor& bytes, const char* op, const char* arg) {
  check_dtype(bytes, ScalarType::u8, op, arg);
  return bytes.contiguous().as_dtype_view(ScalarType::u4);
}

// e4m3 operands arrive as torch float8_e4m3fn or as their uint8 bytes.
Tensor as_e4m3(nb::handle obj, const char* op, const char* arg) {
  Tensor t = tensor_from_python(obj, arg);
  if (t.dtype() == ScalarType::u8) return t.contiguous().as_dtype_view(ScalarType::e4m3);
  check_dtype(t, ScalarType::e4m3, op, arg);
  return t;
}

Tensor optional_tensor(nb::handle obj, const char* arg) {
  return obj.is_none() ? Tensor() : tensor_from_python(obj, arg);
}

// zeros: the zero points, or the mins of w = q*s + m when `mins` (pack_w4_sm80 returns either in that slot).
PackedWeight packed_from_parts(nb::handle data, nb::handle scales, nb::handle zeros, int64_t n, int64_t k, int group,
                               bool symmetric, bool mins = false) {
  PackedWeight p;
  p.format = WeightFormat::w4;
  p.target = PackTarget::sm80;
  p.n = n;
  p.k = k;
  p.group = group;
  p.symmetric = symmetric;
  p.data = tensor_from_python(data, "data");
  p.scales = tensor_from_python(scales, "scales");
  (mins ? p.mins : p.zeros) = tensor_from_python(zeros, mins ? "mins" : "zeros");
  return p;
}

#ifdef LOWBIT_WITH_CUDA
cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// The weight-stationary wgmma kernels' names (W4A16, W4A8): "sm90", or "sm90s" for the serial mainloop (A/B
// timing), then optionally ":S" (split-K cluster 1, 2, 4, 8; 0 = the cost model's) and ":T" (tokens per tile, 128
// or 256). Returns 0 for another name, 1 when parsed into split/tokens/serial, 2 for a malformed sm90 name.
int parse_sm90(const std::string& kernel, int& split, int& tokens, bool& serial, bool small_tiles = false) {
  split = 0, tokens = 0, serial = kernel.rfind("sm90s", 0) == 0;
  if (kernel.rfind("sm90", 0) != 0) return 0;
  std::string rest = kernel.substr(serial ? 5 : 4);
  if (rest.empty()) return 1;
  if (rest[0] != ':') return 2;
  rest = rest.substr(1);
  const size_t colon = rest.find(':');
  const std::string s = rest.substr(0, colon), t = colon == std::string::npos ? "" : rest.substr(colon + 1);
  if (s != "0" && s != "1" && s != "2" && s != "4" && s != "8") return 2;
  const bool small = small_tiles && (t == "16" || t == "32" || t == "64");
  if (colon != std::string::npos && t != "128" && t != "256" && !small) return 2;
  split = s[0] - '0';
  tokens = t.empty() ? 0 : std::stoi(t);
  return 1;
}

// The tail of a multi-tile launch name ("sm90k", "sm90p"): "", ":T" (T = 128 or 256 tokens per tile) or ":T:G"
// (G CTAs, up to 4 digits). False when malformed; tokens and ctas stay 0 where absent.
bool parse_tokens_ctas(const std::string& rest, int& tokens, int& ctas) {
  const size_t colon = rest.find(':', 1);
  const std::string t = rest.empty() ? "" : rest.substr(1, colon == std::string::npos ? std::string::npos : colon - 1);
  const std::string g = colon == std::string::npos ? "" : rest.substr(colon + 1);
  const bool ok = (rest.empty() || (rest[0] == ':' && (t == "128" || t == "256"))) &&
                  (g.empty() || (g.size() <= 4 && g.find_first_not_of("0123456789") == std::string::npos)) &&
                  !(colon != std::string::npos && g.empty());
  if (!ok) return false;
  tokens = t.empty() ? 0 : std::stoi(t);
  ctas = g.empty() ? 0 : std::stoi(g);
  return true;
}

// The W4A16 / W4A8 wgmma kernels' stream-K launch: "sm90k", "sm90k:T" (T = 128 or 256 tokens per tile), "sm90k:T:G"
// (G CTAs, at most the resident ones; tests reach each fix-up path with few); "sm90n": the automatic plan without the
// stream-K candidate. Returns false for another name; sets the options' stream-K fields (the caller names the
// kernel).
template <class Options>
bool parse_sm90k(const char* op, const std::string& kernel, Options& o) {
  if (kernel == "sm90n") {  // the cost model's plan without stream-K (the earlier plans, A/B timing)
    o.sm90_no_streamk = true;
    return true;
  }
  if (kernel.rfind("sm90k", 0) != 0) return false;
  int tokens = 0, ctas = 0;
  const bool ok = parse_tokens_ctas(kernel.substr(5), tokens, ctas);
  LOWBIT_CHECK(ok, op, ": argument 'kernel': stream-K is 'sm90k', 'sm90k:T' or 'sm90k:T:G' (T = 128 or 256 "
               "tokens per tile, G CTAs), got '", kernel, "'");
  o.sm90_streamk = true;
  o.sm90_tokens = tokens, o.sm90_ctas = ctas;
  return true;
}

// The W4A16 wgmma kernel's wide tile (256 weight rows x 128 tokens per CTA): "sm90w" (its split by the cost model),
// "sm90w:S" (split-K cluster S = 1, 2, 4, 8), "sm90wk" / "sm90wk:G" (stream-K, G CTAs); "sm90nw": the automatic plan
// without the wide tile (the plans before it, A/B timing). False for another name.
bool parse_sm90w(const std::string& kernel, cuda::W4A16Options& o) {
  if (kernel == "sm90nw") {
    o.sm90_rows = 128;
    return true;
  }
  if (kernel.rfind("sm90w", 0) != 0) return false;
  const std::string rest = kernel.substr(5);
  bool ok = true;
  if (rest.rfind("k", 0) == 0) {
    const std::string g = rest.size() > 2 && rest[1] == ':' ? rest.substr(2) : rest == "k" ? "0" : "";
    ok = !g.empty() && g.size() <= 4 && g.find_first_not_of("0123456789") == std::string::npos;
    if (ok) o.sm90_streamk = true, o.sm90_ctas = std::stoi(g);
  } else if (!rest.empty()) {
    ok = rest == ":1" || rest == ":2" || rest == ":4" || rest == ":8";
    if (ok) o.sm90_split = rest[1] - '0';
  }
  LOWBIT_CHECK(ok, "gemm_w4a16: argument 'kernel': the wide tile is 'sm90w', 'sm90w:S' (S = 1, 2, 4, 8), 'sm90wk' or "
               "'sm90wk:G' (G CTAs), got '", kernel, "'");
  o.sm90_rows = 256;
  return true;
}

// The W4A16 wgmma kernel with its split-K reduction pinned: "sm90g..." through L2, "sm90c..." through cluster shared
// memory, then what follows as after "sm90" ("sm90g:2:256", "sm90gw:2", "sm90g" = the automatic plan). False for
// another name.
bool parse_sm90_reduce(const std::string& kernel, cuda::W4A16Options& o) {
  if (kernel.rfind("sm90g", 0) != 0 && kernel.rfind("sm90c", 0) != 0) return false;
  o.sm90_reduce = kernel[4] == 'g' ? 2 : 1;
  const std::string inner = "sm90" + kernel.substr(5);
  if (parse_sm90w(inner, o)) return true;
  const int sm90 = parse_sm90(inner, o.sm90_split, o.sm90_tokens, o.sm90_serial);
  LOWBIT_CHECK(sm90 == 1 && !o.sm90_serial, "gemm_w4a16: argument 'kernel': 'sm90g' / 'sm90c' (split-K through L2 / "
               "cluster shared memory) take what 'sm90' or 'sm90w' take after them (e.g. 'sm90g:2:256', 'sm90gw:2'), got '",
               kernel, "'");
  return true;
}

// The W4A8 wgmma kernel's persistent tile loop (opt-in; measured no faster than the automatic plan): "sm90p",
// "sm90p:T" (T = 128 or 256 tokens per tile), "sm90p:T:G" (G CTAs, at most the resident ones; tests pin few to walk
// many tiles each). False for another name.
bool parse_sm90p(const char* op, const std::string& kernel, cuda::W4A8Options& o) {
  if (kernel.rfind("sm90p", 0) != 0) return false;
  int tokens = 0, ctas = 0;
  const bool ok = parse_tokens_ctas(kernel.substr(5), tokens, ctas);
  LOWBIT_CHECK(ok, op, ": argument 'kernel': the persistent kernel is 'sm90p', 'sm90p:T' or 'sm90p:T:G' (T = 128 or "
               "256 tokens per tile, G CTAs), got '", kernel, "'");
  o.sm90_persistent = true;
  o.sm90_tokens = tokens, o.sm90_ctas = ctas;
  return true;
}

// The W4A8 wgmma kernel's multicast pairs (opt-in; measured no faster than the unpaired launch): "sm90m" (one unsplit
// pair launch, the model's tile), "sm90m:T" (T = 128 or 256 tokens per tile); "sm90x": the automatic plan with pairs
// off (the same as "sm90" while pairs are opt-in). False for another name.
bool parse_sm90m(const char* op, const std::string& kernel, cuda::W4A8Options& o) {
  if (kernel == "sm90x") {
    o.sm90_pair = 1;
    return true;
  }
  if (kernel.rfind("sm90m", 0) != 0) return false;
  const std::string rest = kernel.substr(5);
  LOWBIT_CHECK(rest.empty() || rest == ":128" || rest == ":256", op, ": argument 'kernel': multicast pairs are "
               "'sm90m' or 'sm90m:T' (T = 128 or 256 tokens per tile), got '", kernel, "'");
  o.sm90_pair = 2;
  o.sm90_tokens = rest.empty() ? 0 : std::stoi(rest.substr(1));
  return true;
}

// W4A8 and W4A16: "sm90o..." names the wgmma kernel's earlier one-thread producer (A/B timing) with the rest of the
// name as after "sm90" ("sm90o", "sm90o:1:256", "sm90ok:128"; W4A16 also "sm90ow:2", "sm90og:2:256"); returns the
// name without the "o".
template <class Options>
std::string strip_one_producer(const std::string& kernel, Options& o) {
  if (kernel.rfind("sm90o", 0) != 0) return kernel;
  o.sm90_one_producer = true;
  return "sm90" + kernel.substr(5);
}

// W4A8: "sm90q..." names the wgmma kernel with L2 prefetch of later stages and staged scales (opt-in), "sm90r..." the
// same with each weight-row tile's k blocks rotated; the rest of the name as after "sm90" ("sm90q", "sm90q:1:128",
// "sm90qk:128", "sm90r:1:128"); returns the name without the "q" / "r".
std::string strip_prefetch(const std::string& kernel, cuda::W4A8Options& o) {
  if (kernel.rfind("sm90q", 0) != 0 && kernel.rfind("sm90r", 0) != 0) return kernel;
  o.sm90_prefetch = kernel[4] == 'q' ? 1 : 2;
  return "sm90" + kernel.substr(5);
}

// The W4A16 wgmma plan queries' options from a kernel name: '' (the automatic plan) or any sm90 name the op takes.
cuda::W4A16Options sm90_plan_options(const char* op, const std::string& kernel_name) {
  cuda::W4A16Options o;
  const std::string kernel = strip_one_producer(kernel_name, o);
  if (parse_sm90_reduce(kernel, o) || parse_sm90w(kernel, o) || parse_sm90k(op, kernel, o)) return o;
  const int sm90 = parse_sm90(kernel.empty() ? "sm90" : kernel, o.sm90_split, o.sm90_tokens, o.sm90_serial, true);
  LOWBIT_CHECK(sm90 == 1, op, ": argument 'kernel' must be '' or an sm90 name, got '", kernel, "'");
  return o;
}

// The raw GEMM ops take the kernel by a short name (tests and benchmarks compare kernels this way;
// models name theirs through plans). "" = the op's automatic choice.
cuda::W4A16Options w4a16_options(const std::string& kernel_name) {
  cuda::W4A16Options o;
  if (kernel_name.empty()) return o;
  const std::string kernel = strip_one_producer(kernel_name, o);
  o.kernel = cuda::W4A16Kernel::large;
  if (parse_sm90_reduce(kernel, o) || parse_sm90w(kernel, o) || parse_sm90k("gemm_w4a16", kernel, o)) {
    o.kernel = cuda::W4A16Kernel::sm90;
    return o;
  }
  const int sm90 = parse_sm90(kernel, o.sm90_split, o.sm90_tokens, o.sm90_serial, true);
  if (sm90 == 1) o.kernel = cuda::W4A16Kernel::sm90;
  else if (kernel == "small") o.kernel = cuda::W4A16Kernel::small;
  else if (kernel.rfind("decode90", 0) == 0) {
    // "decode90" or "decode90:S", S = the split-K cluster (1, 2, 4, 8)
    const std::string s = kernel.size() > 9 && kernel[8] == ':' ? kernel.substr(9) : kernel.size() == 8 ? "0" : "?";
    LOWBIT_CHECK(s == "0" || s == "1" || s == "2" || s == "4" || s == "8", "gemm_w4a16: argument 'kernel': the split "
                 "in 'decode90:S' must be 1, 2, 4 or 8, got '", kernel, "'");
    o.kernel = cuda::W4A16Kernel::decode_sm90;
    o.sm90_split = s[0] - '0';
  }
  else if (kernel.rfind("gemv", 0) == 0) {
    // "gemv", "gemv:T" (T = 16-row tiles per CTA: 1, 2, 4, 8) or "gemv:T:rDbB" (a compiled configuration: D chunks
    // in flight per warp, B CTAs per SM; the op checks that it exists)
    const std::string t = kernel.size() > 5 && kernel[4] == ':' ? kernel.substr(5, 1) : kernel.size() == 4 ? "0" : "?";
    const std::string rest = kernel.size() > 6 ? kernel.substr(6) : "";
    int ring = 0, blocks = 0, used = 0;
    const bool cfg_ok = rest.empty() || (std::sscanf(rest.c_str(), ":r%db%d%n", &ring, &blocks, &used) == 2 &&
                                         used == static_cast<int>(rest.size()) && ring > 0 && blocks > 0);
    LOWBIT_CHECK((t == "0" || t == "1" || t == "2" || t == "4" || t == "8") && cfg_ok, "gemm_w4a16: argument 'kernel': "
                 "the tiles in 'gemv:T' must be 1, 2, 4 or 8 (optionally 'gemv:T:rDbB', D chunks in flight per warp, B "
                 "CTAs per SM, e.g. 'gemv:1:r4b4'), got '", kernel, "'");
    o.kernel = cuda::W4A16Kernel::gemv;
    o.gemv_tiles = t[0] - '0';
    o.gemv_ring = ring;
    o.gemv_blocks = blocks;
  }
  else if (kernel == "large:64x128") o.large_tile = 64128;
  else if (kernel == "large:128x128") o.large_tile = 128128;
  else if (kernel == "large:128x256") o.large_tile = 128256;
  else
    LOWBIT_CHECK(kernel == "large", "gemm_w4a16: argument 'kernel' must be '', 'small', 'large', 'large:64x128', "
                 "'large:128x128', 'large:128x256', 'decode90', 'decode90:S', 'gemv', 'gemv:T' (T = 1, 2, 4, 8 tiles "
                 "per CTA), 'gemv:T:rDbB' (a compiled ring depth D / CTAs per SM B), 'sm90k[:T[:G]]' (stream-K), "
                 "'sm90' or 'sm90:S' (S = 1, 2, 4, 8: the split-K cluster; "
                 "'sm90:S:T' also pins T = 16, 32, 64, 128 or 256 tokens per tile, S = 0 leaving the split free; "
                 "'sm90s...' the serial mainloop; 'sm90o...' the earlier one-thread producer), got '", kernel, "'");
  return o;
}

cuda::Gemm8Options gemm8_options(const char* op, const std::string& kernel, bool sm90_pairs, bool fp8_fast_accum) {
  cuda::Gemm8Options o;
  o.sm90_pairs = sm90_pairs;
  o.fp8_fast_accum = fp8_fast_accum;
  if (kernel == "sm80") {
    o.kernel = cuda::Gemm8Kernel::sm80;
  } else if (kernel == "sm90" || kernel.rfind("sm90:", 0) == 0) {
    o.kernel = cuda::Gemm8Kernel::sm90;
    const std::string split = kernel.size() > 5 ? kernel.substr(5) : "0";
    LOWBIT_CHECK(split == "0" || split == "1" || split == "2" || split == "4" || split == "8", op,
                 ": argument 'kernel': the split in 'sm90:S' must be 1, 2, 4 or 8, got '", kernel, "'");
    o.sm90_split = std::stoi(split);
  } else {
    LOWBIT_CHECK(kernel.empty(), op, ": argument 'kernel' must be '', 'sm80', 'sm90' or 'sm90:S' (S = 1, 2, 4, 8), "
                 "got '", kernel, "'");
  }
  return o;
}
#else
[[noreturn]] void no_cuda(const char* op) {
  LOWBIT_NOT_SUPPORTED(op, ": this lowbit build has no CUDA support (rebuild with LOWBIT_CUDA=ON)");
}
#endif

}  // namespace

void bind_cuda(nb::module_& m) {
  m.def(
      "cuda_device_info",
      [](int index) {
#ifdef LOWBIT_WITH_CUDA
        const cuda::DeviceInfo d = cuda::device_info(index);
        nb::dict r;
        r["index"] = d.index;
        r["name"] = d.name;
        r["capability"] = nb::make_tuple(d.sm_major, d.sm_minor);
        r["multiprocessors"] = d.multiprocessors;
        r["total_memory"] = d.total_memory;
        r["l2_bytes"] = d.l2_bytes;
        r["max_smem_per_block_optin"] = d.max_smem_per_block_optin;
        r["runtime_version"] = d.runtime_version;
        r["driver_version"] = d.driver_version;
        return r;
#else
        require_device(Device::cuda(index), "cuda_device_info");
        return nb::dict();
#endif
      },
      nb::arg("index") = 0, "Name, compute capability, multiprocessors, memory of CUDA device `index`");

  m.def(
      "pack_w4_sm80",
      [](nb::handle q, nb::handle scales, nb::handle zeros, int group, bool symmetric, nb::handle mins) {
        QuantizedWeight w;
        w.format = WeightFormat::w4;
        w.q = as_u4(tensor_from_python(q, "q"), "pack_w4_sm80", "q");
        check_dim(w.q, 2, "pack_w4_sm80", "q");
        w.n = w.q.size(0);
        w.k = w.q.size(1);
        w.group = group;
        w.symmetric = symmetric;
        w.scales = tensor_from_python(scales, "scales");
        w.zeros = optional_tensor(zeros, "zeros");
        w.mins = optional_tensor(mins, "mins");
        const PackedWeight p = pack_sm80(w, Device::cpu());
        return nb::make_tuple(p.data, p.scales, w.mins.defined() ? p.mins : p.zeros);
      },
      nb::arg("q"), nb::arg("scales"), nb::arg("zeros").none(), nb::arg("group"), nb::arg("symmetric") = false,
      nb::arg("mins").none() = nb::none(),
      "Packs group-wise u4 weights (q: uint8 [n, k/2], two nibbles per byte; scales/zeros f16 [n, groups]; or "
      "mins f16 [n, groups] for w = q*s + m, with zeros None) into the sm80 W4A16 layout on the host: returns "
      "(data, scales, zeros or mins)");
  m.def(
      "unpack_w4_sm80",
      [](nb::handle data, nb::handle scales, nb::handle zeros, int64_t n, int64_t k, int group, bool symmetric) {
        const QuantizedWeight w = unpack_sm80(packed_from_parts(data, scales, zeros, n, k, group, symmetric));
        return nb::make_tuple(w.q.as_dtype_view(ScalarType::u8), w.scales, w.zeros.defined() ? nb::cast(w.zeros) : nb::none());
      },
      nb::arg("data"), nb::arg("scales"), nb::arg("zeros"), nb::arg("n"), nb::arg("k"), nb::arg("group"),
      nb::arg("symmetric") = false, "Inverse of pack_w4_sm80: returns (q bytes [n, k/2], scales, zeros)");

  m.def(
      "dequantize_w4",
      [](nb::handle q, nb::handle scales, nb::handle zeros, int group, nb::handle out, uintptr_t stream) {
#ifdef LOWBIT_WITH_CUDA
        Tensor o = tensor_from_python(out, "out");
        cuda::dequantize_w4(as_u4(tensor_from_python(q, "q"), "dequantize_w4", "q"), tensor_from_python(scales, "scales"),
                            optional_tensor(zeros, "zeros"), group, o, as_stream(stream));
#else
        no_cuda("dequantize_w4");
#endif
      },
      nb::arg("q"), nb::arg("scales"), nb::arg("zeros").none(), nb::arg("group"), nb::arg("out"),
      nb::arg("stream") = 0, "GPU: out[n, k] (f16/bf16) = (q - zero) * scale for group-wise u4 weights");

  m.def(
      "gemm_w4a16",
      [](nb::handle x, nb::handle data, nb::handle scales, nb::handle zeros, int64_t n, int64_t k, int group,
         nb::handle y, int split_k, nb::handle workspace, uintptr_t stream, const std::string& kernel, bool mins) {
#ifdef LOWBIT_WITH_CUDA
        const cuda::W4A16Options options = w4a16_options(kernel);
        Tensor out = tensor_from_python(y, "y");
        cuda::gemm_w4a16(tensor_from_python(x, "x"), packed_from_parts(data, scales, zeros, n, k, group, false, mins),
                         out, split_k, optional_tensor(workspace, "workspace"), as_stream(stream), options);
#else
        no_cuda("gemm_w4a16");
#endif
      },
      nb::arg("x"), nb::arg("data"), nb::arg("scales"), nb::arg("zeros"), nb::arg("n"), nb::arg("k"),
      nb::arg("group"), nb::arg("y"), nb::arg("split_k") = 0, nb::arg("workspace").none() = nb::none(),
      nb::arg("stream") = 0, nb::arg("kernel") = "", nb::arg("mins") = false,
      "GPU: y[m, n] = x[m, k] · Wᵀ with W packed by pack_w4_sm80 (on the device); mins: `zeros` holds the mins "
      "of w = q*s + m. kernel: '' (automatic), 'small', 'large', 'large:64x128', 'large:128x128', "
      "'large:128x256', 'decode90[:S]', 'gemv[:T[:rDbB]]', 'sm90k[:T[:G]]' or 'sm90[:S[:T]]' (see w4a16_options; "
      "'sm90o...': the earlier one-thread producer)");

  m.def(
      "gemm_w8a16",
      [](nb::handle x, nb::handle q, nb::handle scales, int group, nb::handle y, int split_k, nb::handle workspace,
         uintptr_t stream) {
#ifdef LOWBIT_WITH_CUDA
        PackedWeight w;
        w.format = WeightFormat::w8;
        w.target = PackTarget::sm80;
        w.data = tensor_from_python(q, "q");
        check_dim(w.data, 2, "gemm_w8a16", "q");
        w.n = w.data.size(0);
        w.k = w.data.size(1);
        w.group = group;
        w.scales = tensor_from_python(scales, "scales");
        Tensor out = tensor_from_python(y, "y");
        cuda::gemm_w8a16(tensor_from_python(x, "x"), w, out, split_k, optional_tensor(workspace, "workspace"),
                         as_stream(stream));
#else
        no_cuda("gemm_w8a16");
#endif
      },
      nb::arg("x"), nb::arg("q"), nb::arg("scales"), nb::arg("group"), nb::arg("y"), nb::arg("split_k") = 0,
      nb::arg("workspace").none() = nb::none(), nb::arg("stream") = 0,
      "GPU: y[m, n] = x[m, k] · Wᵀ for W = q * scale (q int8 [n, k] row-major on the device; scales f32 [n] with "
      "group 0, else [n, ceil(k / group)])");

  m.def(
      "gemm_wfp8a16",
      [](nb::handle x, nb::handle q, nb::handle scales, nb::handle y, int split_k, nb::handle workspace,
         uintptr_t stream) {
#ifdef LOWBIT_WITH_CUDA
        PackedWeight w;
        w.format = WeightFormat::e4m3;
        w.target = PackTarget::sm80;
        w.data = tensor_from_python(q, "q");
        check_dim(w.data, 2, "gemm_wfp8a16", "q");
        w.n = w.data.size(0);
        w.k = w.data.size(1);
        w.group = 0;
        w.scales = tensor_from_python(scales, "scales");
        Tensor out = tensor_from_python(y, "y");
        cuda::gemm_wfp8a16(tensor_from_python(x, "x"), w, out, split_k, optional_tensor(workspace, "workspace"),
                           as_stream(stream));
#else
        no_cuda("gemm_wfp8a16");
#endif
      },
      nb::arg("x"), nb::arg("q"), nb::arg("scales"), nb::arg("y"), nb::arg("split_k") = 0,
      nb::arg("workspace").none() = nb::none(), nb::arg("stream") = 0,
      "GPU: y[m, n] = x[m, k] · Wᵀ for W = q * scale (q float8_e4m3fn [n, k] row-major on the device, scales f32 "
      "[n]): weight-only FP8");

  m.def(
      "gemm_w4a16_pick_split",
      [](int64_t m, int64_t n, int64_t k, int device, const std::string& kernel) {
#ifdef LOWBIT_WITH_CUDA
        return cuda::gemm_w4a16_pick_split(m, n, k, device, w4a16_options(kernel));
#else
        no_cuda("gemm_w4a16_pick_split");
#endif
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("device") = 0, nb::arg("kernel") = "");

  m.def(
      "gemm_w4a16_sm90_plan_rows",
      [](int64_t m, int64_t n, int64_t k, int device, const std::string& kernel_name) {
#ifdef LOWBIT_WITH_CUDA
        const cuda::W4A16Options o = sm90_plan_options("gemm_w4a16_sm90_plan_rows", kernel_name);
        return cuda::gemm_w4a16_sm90_plan_rows(m, n, k, device, o);
#else
        no_cuda("gemm_w4a16_sm90_plan_rows");
#endif
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("device") = 0, nb::arg("kernel") = "",
      "Weight rows per CTA (128, or 256: the wide tile) of gemm_w4a16_sm90_plan's plan.");

  m.def(
      "gemm_w4a16_sm90_plan",
      [](int64_t m, int64_t n, int64_t k, int device, const std::string& kernel_name) {
#ifdef LOWBIT_WITH_CUDA
        const cuda::W4A16Options o = sm90_plan_options("gemm_w4a16_sm90_plan", kernel_name);
        return cuda::gemm_w4a16_sm90_plan(m, n, k, device, o);
#else
        no_cuda("gemm_w4a16_sm90_plan");
#endif
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("device") = 0, nb::arg("kernel") = "",
      "GPU (sm_90): the W4A16 wgmma kernel's (tokens per tile, split-K cluster, head) for this shape; head > 0: tiles "
      "[0, head) run unsplit first, the rest at the split; split 0: one stream-K launch (every resident CTA an equal "
      "range of tile x k blocks)");

  m.def(
      "gemm_w4a16_gemv_plan",
      [](int64_t m, int64_t n, int64_t k, int device, const std::string& kernel) -> std::tuple<int, int> {
#ifdef LOWBIT_WITH_CUDA
        const cuda::W4A16Options o = w4a16_options(kernel.empty() ? "gemv" : kernel);
        LOWBIT_CHECK(o.kernel == cuda::W4A16Kernel::gemv, "gemm_w4a16_gemv_plan: argument 'kernel' must be '' or "
                     "'gemv[:T[:rDbB]]', got '", kernel, "'");
        const auto [tiles, split] = cuda::gemm_w4a16_gemv_plan(m, n, k, device, o.gemv_tiles, o.gemv_ring,
                                                                o.gemv_blocks);
        return {tiles, split};
#else
        no_cuda("gemm_w4a16_gemv_plan");
#endif
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("device") = 0, nb::arg("kernel") = "",
      "GPU: the register-direct W4A16 GEMV's (16-row tiles per CTA, CTAs along k) for this shape (1-8 tokens)");

  m.def(
      "gemm_w4a16_decode_sm90_split",
      [](int64_t m, int64_t n, int64_t k, int device) {
#ifdef LOWBIT_WITH_CUDA
        return cuda::gemm_w4a16_decode_sm90_split(m, n, k, device);
#else
        no_cuda("gemm_w4a16_decode_sm90_split");
#endif
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("device") = 0,
      "GPU (sm_90): the split-K cluster the W4A16 decode kernel takes for this shape");

  m.def(
      "quantize_per_token_s8",
      [](nb::handle x, nb::handle q, nb::handle scales, uintptr_t stream) {
#ifdef LOWBIT_WITH_CUDA
        Tensor qt = tensor_from_python(q, "q"), st = tensor_from_python(scales, "scales");
        cuda::quantize_per_token_s8(tensor_from_python(x, "x"), qt, st, as_stream(stream));
#else
        no_cuda("quantize_per_token_s8");
#endif
      },
      nb::arg("x"), nb::arg("q"), nb::arg("scales"), nb::arg("stream") = 0,
      "GPU: per-token symmetric int8 quantization of f16 activations (q s8 [m, k], scales f32 [m])");
  m.def(
      "gemm_w8a8",
      [](nb::handle xq, nb::handle x_scale, nb::handle wq, nb::handle w_scale, nb::handle y, uintptr_t stream,
         const std::string& kernel, bool sm90_pairs) {
#ifdef LOWBIT_WITH_CUDA
        const cuda::Gemm8Options options = gemm8_options("gemm_w8a8", kernel, sm90_pairs, false);
        Tensor out = tensor_from_python(y, "y");
        cuda::gemm_w8a8(tensor_from_python(xq, "xq"), optional_tensor(x_scale, "x_scale"), tensor_from_python(wq, "wq"),
                        optional_tensor(w_scale, "w_scale"), out, as_stream(stream), options);
#else
        no_cuda("gemm_w8a8");
#endif
      },
      nb::arg("xq"), nb::arg("x_scale").none(), nb::arg("wq"), nb::arg("w_scale").none(), nb::arg("y"),
      nb::arg("stream") = 0, nb::arg("kernel") = "", nb::arg("sm90_pairs") = false,
      "GPU: y = (xq · wqᵀ) * x_scale[m] * w_scale[n] (f16 y), or the raw int32 accumulators (s32 y). kernel: '' "
      "(wgmma on sm_90, else mma.sync), 'sm80', 'sm90' or 'sm90:S' (split-K cluster S = 1, 2, 4, 8); "
      "sm90_pairs: multicast weight tiles to pairs of A tiles");

  m.def(
      "gemm_w4a8",
      [](nb::handle xq, nb::handle x_scale, const PackedWeight& w, nb::handle y, int split_k, uintptr_t stream,
         const std::string& kernel_name) {
#ifdef LOWBIT_WITH_CUDA
        cuda::W4A8Options options;
        options.split_k = split_k;
        const std::string kernel = strip_prefetch(strip_one_producer(kernel_name, options), options);
        const int sm90 = parse_sm90k("gemm_w4a8", kernel, options) || parse_sm90p("gemm_w4a8", kernel, options) ||
                                 parse_sm90m("gemm_w4a8", kernel, options)
                             ? 1
                             : parse_sm90(kernel, options.sm90_split, options.sm90_tokens, options.sm90_serial, true);
        LOWBIT_CHECK(sm90 != 2, "gemm_w4a8: argument 'kernel': the split in 'sm90:S' must be 1, 2, 4 or 8 (or 0 "
                     "with a tile: 'sm90:S:T', T = 16, 32, 64, 128 or 256 tokens; 'sm90s...' the serial "
                     "mainloop), got '",
                     kernel, "'");
        if (sm90 == 1) {
          options.kernel = cuda::Gemm8Kernel::sm90;
        } else if (kernel.rfind("gemv", 0) == 0) {
          // "gemv" or "gemv:rDbB" (a compiled configuration: D chunks in flight per warp, B CTAs per SM; the op
          // checks that it exists); "gemvw[:rDbB]" the wide plan (4 weight tiles per CTA, k split to fill the SMs)
          const bool wide = kernel.rfind("gemvw", 0) == 0;
          options.gemv_width = wide ? cuda::GemvWidth::wide : cuda::GemvWidth::one_tile;
          const std::string rest = kernel.substr(wide ? 5 : 4);
          int ring = 0, blocks = 0, used = 0;
          LOWBIT_CHECK(rest.empty() || (std::sscanf(rest.c_str(), ":r%db%d%n", &ring, &blocks, &used) == 2 &&
                                        used == static_cast<int>(rest.size()) && ring > 0 && blocks > 0),
                       "gemm_w4a8: argument 'kernel': 'gemv' takes an optional ':rDbB' (D chunks in flight per warp, "
                       "B CTAs per SM, e.g. 'gemv:r4b4'), got '", kernel, "'");
          options.kernel = cuda::Gemm8Kernel::gemv;
          options.gemv_ring = ring;
          options.gemv_blocks = blocks;
        } else {
          const cuda::Gemm8Options choice = gemm8_options("gemm_w4a8", kernel, false, false);
          options.kernel = choice.kernel;
          options.sm90_split = choice.sm90_split;
        }
        Tensor out = tensor_from_python(y, "y");
        cuda::gemm_w4a8(tensor_from_python(xq, "xq"), optional_tensor(x_scale, "x_scale"), w, out, as_stream(stream),
                        options);
#else
        no_cuda("gemm_w4a8");
#endif
      },
      nb::arg("xq"), nb::arg("x_scale").none(), nb::arg("w"), nb::arg("y"), nb::arg("split_k") = 0,
      nb::arg("stream") = 0, nb::arg("kernel") = "",
      "GPU: y = (xq · Wᵀ) * x_scale[m] * channel_scale[n] for a qoq/liquid PackedWeight packed for sm80 on the "
      "device (f16 y), or the raw int32 accumulators (s32 y, x_scale may be None). kernel: '' (on sm_90 the gemv at "
      "1-4 tokens, wgmma from 17 tokens and from 5 on layers of 16384+ rows, else mma.sync), 'sm80' (split_k: 0 "
      "automatic), 'sm90' or 'sm90:S' (split-K cluster S = 1, 2, 4, 8), "
      "'sm90:S:T' (T = 16, 32, 64, 128 or 256 tokens per tile, S = 0 leaves the split to the cost model; the automatic "
      "plan takes the 16 / 32 / 64-token tiles at 5-64 tokens), 'sm90s...' (the serial "
      "mainloop, for A/B timing), 'sm90o...' (the earlier one-thread producer, for A/B timing: 'sm90o', 'sm90o:S:T', "
      "'sm90ok...'), 'sm90p[:T[:G]]' (the persistent tile loop, opt-in: the resident CTAs walk whole tiles, G pins the "
      "CTAs), 'sm90m[:T]' (multicast pairs, opt-in: two CTAs on neighbouring weight-row tiles share the activation "
      "tile), 'sm90x' (the automatic plan with pairs off: the same as 'sm90'), 'sm90q...' (opt-in: L2 prefetch of later "
      "stages' weights and parameters, the tile's scales staged in smem; the rest as after 'sm90', e.g. 'sm90q:1:128', "
      "'sm90qk:128'), 'sm90r...' (opt-in: 'sm90q' with each weight-row tile's k blocks in a rotated order), 'gemv' or 'gemv:rDbB' (the "
      "register-direct GEMV, 1-16 tokens, one 16-row weight tile per CTA; automatic at 1-4 tokens on sm_90, where its "
      "width follows the shape), 'gemvw[:rDbB]' (its wide plan: 4 weight tiles per CTA share one copy of x, k split "
      "over CTAs to fill the SMs)");

  m.def(
      "gemm_w4a8_sm90_plan",
      [](int64_t m, int64_t n, int64_t k, int device, const std::string& kernel_name) {
#ifdef LOWBIT_WITH_CUDA
        cuda::W4A8Options o;
        const std::string kernel = strip_prefetch(strip_one_producer(kernel_name, o), o);
        if (parse_sm90k("gemm_w4a8_sm90_plan", kernel, o) || parse_sm90p("gemm_w4a8_sm90_plan", kernel, o) ||
            parse_sm90m("gemm_w4a8_sm90_plan", kernel, o))
          return cuda::gemm_w4a8_sm90_plan(m, n, k, device, o);
        const int sm90 =
            parse_sm90(kernel.empty() ? "sm90" : kernel, o.sm90_split, o.sm90_tokens, o.sm90_serial, true);
        LOWBIT_CHECK(sm90 == 1, "gemm_w4a8_sm90_plan: argument 'kernel' must be '' or an sm90 name, got '", kernel,
                     "'");
        return cuda::gemm_w4a8_sm90_plan(m, n, k, device, o);
#else
        no_cuda("gemm_w4a8_sm90_plan");
#endif
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("device") = 0, nb::arg("kernel") = "",
      "GPU (sm_90): the W4A8 wgmma kernel's (tokens per tile, split-K cluster, head) for this shape (split 0: stream-K); head > 0: tiles "
      "[0, head) run unsplit first, the rest at the split");

  m.def(
      "quantize_fmpq_gpu",
      [](nb::handle x, nb::handle block_bits, nb::handle q, nb::handle scales, uintptr_t stream, nb::handle perm) {
#ifdef LOWBIT_WITH_CUDA
        Tensor qt = tensor_from_python(q, "q"), st = tensor_from_python(scales, "scales");
        const Tensor p = perm.is_none() ? Tensor() : tensor_from_python(perm, "perm");
        cuda::quantize_fmpq(tensor_from_python(x, "x"), tensor_from_python(block_bits, "block_bits"), qt, st,
                            as_stream(stream), p);
#else
        no_cuda("quantize_fmpq_gpu");
#endif
      },
      nb::arg("x"), nb::arg("block_bits"), nb::arg("q"), nb::arg("scales"), nb::arg("stream") = 0,
      nb::arg("perm").none() = nb::none(),
      "GPU: COMET FMPQ into caller-allocated q s8 [m, k] and scales f32 [m, blocks] on `stream` (block_bits: a "
      "host uint8 tensor of 4 / 8 per 128 channels); quantize_fmpq's codes and scales bit for bit; perm (s32 [k] on "
      "the device, optional): of x[:, perm]");
  m.def(
      "gemm_fmpq",
      [](nb::handle xq, nb::handle x_scale, const PackedWeight& w, nb::handle y, int split_k, uintptr_t stream,
         const std::string& kernel, nb::handle block_bits) {
#ifdef LOWBIT_WITH_CUDA
        LOWBIT_CHECK(kernel.empty() || kernel == "sm80" || kernel == "sm90" || kernel == "sm90s" || kernel == "s4" ||
                         kernel == "gemv" || kernel == "gemv1" || kernel == "gemvw",
                     "gemm_fmpq: argument 'kernel' must be '', 'sm80', 's4', 'sm90', 'sm90s' (the serial mainloop), "
                     "'gemv', 'gemv1' or 'gemvw', got '", kernel, "'");
        const cuda::FmpqKernel k = kernel == "sm80"    ? cuda::FmpqKernel::sm80
                                   : kernel == "s4"    ? cuda::FmpqKernel::sm80_s4
                                   : kernel == "sm90"  ? cuda::FmpqKernel::sm90
                                   : kernel == "sm90s" ? cuda::FmpqKernel::sm90_serial
                                   : kernel == "gemv"  ? cuda::FmpqKernel::gemv
                                   : kernel == "gemv1" ? cuda::FmpqKernel::gemv_one_tile
                                   : kernel == "gemvw" ? cuda::FmpqKernel::gemv_wide
                                                       : cuda::FmpqKernel::automatic;
        Tensor out = tensor_from_python(y, "y");
        cuda::gemm_fmpq(tensor_from_python(xq, "xq"), optional_tensor(x_scale, "x_scale"), w, out, as_stream(stream),
                        split_k, k, optional_tensor(block_bits, "block_bits"));
#else
        no_cuda("gemm_fmpq");
#endif
      },
      nb::arg("xq"), nb::arg("x_scale").none(), nb::arg("w"), nb::arg("y"), nb::arg("split_k") = 0,
      nb::arg("stream") = 0, nb::arg("kernel") = "", nb::arg("block_bits") = nb::none(),
      "GPU, COMET W4Ax: FMPQ codes xq s8 [m, k] and scales f32 [m, blocks] times a qoq/liquid PackedWeight packed "
      "for sm80 on the device; y f16/f32 [m, n] = channel_scale[n] * sum_b x_scale[m, b] * acc_b, or s32 "
      "[m, blocks, n]: the raw int32 sum of each 128-channel block (x_scale may be None). kernel: '' (wgmma on "
      "sm_90 from 128 tokens, else mma.sync), 'sm80' (split_k: 0 automatic, else the number of splits, whole "
      "blocks each), 's4' (int4 tensor cores for the int4 blocks of `block_bits`, a host uint8 tensor of 4 / 8 "
      "per block; as 'sm80' otherwise, the same int32 block sums; the default on sm_80/86/87/89 when block_bits is "
      "given), 'sm90' (scaled outputs; split_k: 0 automatic or the cluster size 1, 2, 4, 8; each block's flush under "
      "the next block's wgmmas), 'sm90s' (the same kernel flushing between blocks; bit-identical outputs), "
      "'gemv' (the register-direct GEMV, 1-16 tokens, scaled outputs, split_k 0; its width by shape: the default on "
      "sm_90 at 1-4 tokens; equal to the others to f32 rounding), 'gemv1' / 'gemvw' (one weight tile per CTA / the "
      "wide plan)");

  m.def(
      "quantize_per_token_e4m3",
      [](nb::handle x, nb::handle q, nb::handle scales, uintptr_t stream) {
#ifdef LOWBIT_WITH_CUDA
        Tensor qt = as_e4m3(q, "quantize_per_token_e4m3", "q"), st = tensor_from_python(scales, "scales");
        cuda::quantize_per_token_e4m3(tensor_from_python(x, "x"), qt, st, as_stream(stream));
#else
        no_cuda("quantize_per_token_e4m3");
#endif
      },
      nb::arg("x"), nb::arg("q"), nb::arg("scales"), nb::arg("stream") = 0,
      "GPU: per-token e4m3 quantization of f16 activations (q e4m3 or its uint8 bytes [m, k], scales f32 [m])");
  m.def(
      "gemm_fp8",
      [](nb::handle xq, nb::handle x_scale, nb::handle wq, nb::handle w_scale, nb::handle y, uintptr_t stream,
         const std::string& kernel, bool sm90_pairs, bool fast_accum) {
#ifdef LOWBIT_WITH_CUDA
        const cuda::Gemm8Options options = gemm8_options("gemm_fp8", kernel, sm90_pairs, fast_accum);
        Tensor out = tensor_from_python(y, "y");
        cuda::gemm_fp8(as_e4m3(xq, "gemm_fp8", "xq"), optional_tensor(x_scale, "x_scale"), as_e4m3(wq, "gemm_fp8", "wq"),
                       optional_tensor(w_scale, "w_scale"), out, as_stream(stream), options);
#else
        no_cuda("gemm_fp8");
#endif
      },
      nb::arg("xq"), nb::arg("x_scale").none(), nb::arg("wq"), nb::arg("w_scale").none(), nb::arg("y"),
      nb::arg("stream") = 0, nb::arg("kernel") = "", nb::arg("sm90_pairs") = false, nb::arg("fast_accum") = false,
      "GPU (sm_89+): y = (xq · wqᵀ) * x_scale[m] * w_scale[n] on e4m3 tensor cores (f16 y), or the raw f32 "
      "accumulators (f32 y); xq/wq e4m3 or uint8 bytes. kernel and sm90_pairs as gemm_w8a8; fast_accum: the "
      "sm90 kernel keeps the tensor cores' own sums (no per-stage f32 promotion)");

  m.def(
      "decode_attention",
      [](nb::handle q, nb::handle k_data, nb::handle v_data, nb::handle k_params, nb::handle v_params,
         nb::handle block_tables, nb::handle seq_lens, int max_seq_len, float scale, nb::handle out,
         const std::string& kv_dtype, int split_tokens, uintptr_t stream, const std::string& v_dtype) {
#ifdef LOWBIT_WITH_CUDA
        const char* op = "decode_attention";
        auto typed = [&](nb::handle obj, const std::string& dtype, const char* arg) {
          LOWBIT_CHECK(dtype == "f16" || dtype == "u8" || dtype == "u4" || dtype == "u2", op, ": the dtype of '", arg,
                       "' must be 'f16', 'u8', 'u4' or 'u2', got '", dtype, "'");
          const Tensor t = tensor_from_python(obj, arg);
          if (dtype == "u2") {
            check_dtype(t, ScalarType::u8, op, arg);
            return t.contiguous().as_dtype_view(ScalarType::u2);
          }
          return dtype == "u4" ? as_u4(t, op, arg) : t;
        };
        const Tensor k = typed(k_data, kv_dtype, "k_data");
        const Tensor v = typed(v_data, v_dtype.empty() ? kv_dtype : v_dtype, "v_data");
        Tensor o = tensor_from_python(out, "out");
        cuda::decode_attention(tensor_from_python(q, "q"), k, v, optional_tensor(k_params, "k_params"),
                               optional_tensor(v_params, "v_params"), tensor_from_python(block_tables, "block_tables"),
                               tensor_from_python(seq_lens, "seq_lens"), max_seq_len, scale, o, split_tokens,
                               as_stream(stream));
#else
        no_cuda("decode_attention");
#endif
      },
      nb::arg("q"), nb::arg("k_data"), nb::arg("v_data"), nb::arg("k_params").none(), nb::arg("v_params").none(),
      nb::arg("block_tables"), nb::arg("seq_lens"), nb::arg("max_seq_len"), nb::arg("scale"), nb::arg("out"),
      nb::arg("kv_dtype") = "f16", nb::arg("split_tokens") = 0, nb::arg("stream") = 0, nb::arg("v_dtype") = "",
      "GPU: decode attention over a paged KV cache. kv_dtype is K's type (and V's unless v_dtype is given): "
      "'f16', 'u8', 'u4' (passed as uint8 bytes [.., D/2]) or 'u2' (uint8 bytes [.., D/4], dim 4i + j in bits 2j of "
      "byte i)");
}

}  // namespace lowbit::bindings
