// Lookup over the registries (include/lowbit/kernels/registry.h): ask every kernel, keep every
// answer, pick the forced kernel or the best-ranked fit, and fail loudly with all the reasons.
#include "lowbit/kernels/registry.h"

#include <sstream>

#include "kernels/registry/registration.h"
#include "lowbit/core/error.h"

namespace lowbit::kernels {

const std::vector<GemmKernel>& gemm_kernels() {
  static const std::vector<GemmKernel> all = [] {
    std::vector<GemmKernel> v;
    register_gemm_cpu(v);
    register_gemm_sm80(v);
    register_gemm_sm90(v);
    register_gemm_cublaslt(v);
    return v;
  }();
  return all;
}

const std::vector<AttnKernel>& attention_kernels() {
  static const std::vector<AttnKernel> all = [] {
    std::vector<AttnKernel> v;
    register_attention_cpu(v);
    register_attention_sm80(v);
    register_attention_sm90(v);
    return v;
  }();
  return all;
}

namespace {

// can_run's reason for a kernel of the other device kind starts so (registration.h: on_device).
bool other_device(const Verdict& v) { return v.fit == Fit::no && v.why.rfind("runs on ", 0) == 0; }

const char* fit_word(Fit f) { return f == Fit::yes ? "fits" : f == Fit::fallback ? "slow fallback" : "cannot run"; }

template <class Entry, class Desc>
Selection<Entry> lookup(const std::vector<Entry>& all, const Desc& desc, const std::string& forced) {
  Selection<Entry> s;
  int best_rank = 0;
  const Entry* best_fallback = nullptr;
  int best_fallback_rank = 0;
  for (const Entry& e : all) {
    Verdict v{e.name, Fit::no, ""};
    v.fit = e.can_run(desc, &v.why);
    if (!forced.empty()) {
      if (forced == e.name && v.fit != Fit::no) {
        s.kernel = &e;
        s.forced = true;
        s.fallback = v.fit == Fit::fallback;
      }
    } else if (v.fit == Fit::yes) {
      const int r = e.rank(desc);
      if (s.kernel == nullptr || r > best_rank) s.kernel = &e, best_rank = r;
    } else if (v.fit == Fit::fallback) {
      const int r = e.rank(desc);
      if (best_fallback == nullptr || r > best_fallback_rank) best_fallback = &e, best_fallback_rank = r;
    }
    s.verdicts.push_back(std::move(v));
  }
  if (forced.empty() && s.kernel == nullptr && best_fallback != nullptr) {
    s.kernel = best_fallback;
    s.fallback = true;
  }
  return s;
}

template <class Entry, class Desc>
Selection<Entry> select_checked(const std::vector<Entry>& all, const Desc& desc, const std::string& forced,
                                bool strict, const char* what) {
  Selection<Entry> s = lookup(all, desc, forced);
  if (!forced.empty()) {
    bool known = false;
    for (const Entry& e : all) known = known || forced == e.name;
    if (!known) {
      std::string names;
      for (const Entry& e : all) names += (names.empty() ? "" : ", ") + std::string(e.name);
      LOWBIT_CHECK_KIND(ErrorKind::kValue, false, what, ": forced kernel '", forced, "' is not registered; kernels: ",
                        names);
    }
    if (s.kernel == nullptr) {
      for (const Verdict& v : s.verdicts)
        if (v.kernel == forced)
          LOWBIT_NOT_SUPPORTED(what, ": forced kernel ", forced, " cannot run ", desc.to_string(), ": ", v.why);
    }
  }
  if (s.kernel == nullptr)
    LOWBIT_NOT_SUPPORTED(what, ": no kernel for ", desc.to_string(), ": ", s.reasons());
  if (strict && s.fallback)
    LOWBIT_NOT_SUPPORTED(what, ": strict: ", desc.to_string(), " would take the slow fallback ", s.kernel->name,
                         " (", s.why_chosen(), "); candidates: ", s.reasons());
  return s;
}

}  // namespace

template <class Entry>
std::string Selection<Entry>::reasons() const {
  // Kernels of the other device kind ("runs on cuda") are left out: they were never candidates.
  std::ostringstream o;
  bool first = true;
  for (const Verdict& v : verdicts) {
    if (other_device(v)) continue;
    o << (first ? "" : "; ") << v.kernel << ": " << (v.why.empty() ? fit_word(v.fit) : v.why);
    first = false;
  }
  return o.str();
}

template <class Entry>
std::string Selection<Entry>::why_chosen() const {
  if (kernel == nullptr) return "no kernel";
  std::string why;
  for (const Verdict& v : verdicts)
    if (v.kernel == kernel->name) why = v.why;
  std::string out = forced ? "forced" : fallback ? "slow fallback" : "best ranked fit";
  if (!why.empty()) out += ": " + why;
  if (fallback) {
    std::string faster;
    for (const Verdict& v : verdicts)
      if (v.fit == Fit::no && !v.why.empty() && v.kernel != kernel->name && !other_device(v))
        faster += (faster.empty() ? "" : "; ") + v.kernel + ": " + v.why;
    if (!faster.empty()) out += " [not taken: " + faster + "]";
  }
  return out;
}

template struct Selection<GemmKernel>;
template struct Selection<AttnKernel>;

GemmSelection select_gemm(const GemmDesc& desc, const std::string& forced, bool strict, const char* what) {
  return select_checked(gemm_kernels(), desc, forced, strict, what);
}
AttnSelection select_attention(const AttnDesc& desc, const std::string& forced, bool strict, const char* what) {
  return select_checked(attention_kernels(), desc, forced, strict, what);
}
GemmSelection try_select_gemm(const GemmDesc& desc) { return lookup(gemm_kernels(), desc, ""); }
AttnSelection try_select_attention(const AttnDesc& desc) { return lookup(attention_kernels(), desc, ""); }

}  // namespace lowbit::kernels
