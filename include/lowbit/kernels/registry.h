// Kernel registries: every GEMM and attention kernel (CPU and GPU) is an entry with a name, a
// can_run(desc, &why) predicate, a rank for the automatic choice and a launch function. Lookup
// asks every entry and keeps every answer, so a miss is an error that lists each candidate's
// reason, and a plan can say why it took its kernel.
//
// Adding a kernel: write the kernel file, add its entry to the family's registration file in
// cpp/kernels/registry/ (gemm_{cpu,sm80,sm90}.cpp, attention_{cpu,sm80}.cpp), and a test.
#pragma once
#include <string>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/kernels/desc.h"
#include "lowbit/kernels/options.h"
#include "lowbit/kv/attention_meta.h"
#include "lowbit/kv/kv_cache.h"
#include "lowbit/quant/pack.h"

namespace lowbit::kernels {

// A kernel's answer for a descriptor: it cannot run it, it can but is a slow fallback (some faster
// kernel could not run; strict plans refuse it), or it runs it as intended.
enum class Fit : uint8_t { no, fallback, yes };

// Everything a GEMM launch reads. x: float rows (act float16, or a quantizing act the kernel applies
// itself) or s8/e4m3 codes with x_scales f32 [m] (the caller quantized them).
struct GemmArgs {
  const Tensor& x;
  const Tensor& x_scales;  // undefined unless x holds codes
  const PackedWeight& w;
  const Tensor& bias;      // undefined: none
  Tensor& y;
  ActivationMode act;
  KernelTuning tuning;
  const Tensor* block_bits = nullptr;  // act fmpq_mixed: the host u8 block map (4 / 8 per 128 channels), if known
};

struct AttnArgs {
  const Tensor& q;
  const KVCache& cache;
  int layer;
  const AttentionMeta& meta;
  const Tensor& seq_info;  // GPU: s32 [3, num_seqs] (q_start, q_len, kv_len) on the device
  int max_q_len, max_kv_len;
  float scale;
  Tensor& out;
  KernelTuning tuning;  // the plan's (defaults for an unplanned call)
};

template <class Desc, class Args>
struct KernelEntry {
  const char* name;     // the file's name: "gemm_w4a16_sm80", "decode_attention_sm80", ...
  const char* summary;  // one line for docs/support.md
  Fit (*can_run)(const Desc& desc, std::string* why);  // why: set to the reason (no / fallback)
  int (*rank)(const Desc& desc);  // automatic choice among the kernels that fit: the highest wins
  void (*launch)(const Args& args);  // null where this build lacks the kernel's code (GPU in a CPU build)
};
using GemmKernel = KernelEntry<GemmDesc, GemmArgs>;
using AttnKernel = KernelEntry<AttnDesc, AttnArgs>;

// Every registered kernel of a family, in registration order (CPU first, then by arch).
const std::vector<GemmKernel>& gemm_kernels();
const std::vector<AttnKernel>& attention_kernels();

// One candidate's answer.
struct Verdict {
  std::string kernel;
  Fit fit = Fit::no;
  std::string why;
};

// A lookup's outcome: the kernel (null when none can run), whether it is a fallback or was forced,
// and every candidate's verdict (the error message and `lowbit info --plan` print them).
template <class Entry>
struct Selection {
  const Entry* kernel = nullptr;
  bool fallback = false, forced = false;
  std::vector<Verdict> verdicts;
  std::string reasons() const;  // "name: why; name: why; ..."
  std::string why_chosen() const;
};
using GemmSelection = Selection<GemmKernel>;
using AttnSelection = Selection<AttnKernel>;

// The kernel for a descriptor: `forced` (a kernel name, "" for the automatic choice) must fit or it
// throws NotSupported with its reason; with no fitting kernel it throws NotSupported listing every
// candidate's reason; with `strict`, a fallback throws as well. `what` names the caller in errors
// ("Model: linear.qkv"). Never returns a null kernel.
GemmSelection select_gemm(const GemmDesc& desc, const std::string& forced = "", bool strict = false,
                          const char* what = "linear");
AttnSelection select_attention(const AttnDesc& desc, const std::string& forced = "", bool strict = false,
                               const char* what = "paged_attention");
// The same, but a miss returns a Selection with a null kernel instead of throwing (support matrix).
GemmSelection try_select_gemm(const GemmDesc& desc);
AttnSelection try_select_attention(const AttnDesc& desc);

}  // namespace lowbit::kernels
