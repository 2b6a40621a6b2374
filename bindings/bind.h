// One bind_<area> per binding file; module.cpp calls them all.
#pragma once
#include <nanobind/nanobind.h>

namespace lowbit::bindings {
void bind_core(nanobind::module_& m);    // core.cpp   : Tensor, DLPack, devices, allocators
void bind_quant(nanobind::module_& m);   // quant.cpp  : formats, quantize/dequantize, packer
void bind_kv(nanobind::module_& m);      // kv.cpp     : paged KV allocator
void bind_ops(nanobind::module_& m);        // ops.cpp       : linear, norms, elementwise, sampling
void bind_attention(nanobind::module_& m);  // attention.cpp : rope, kv_write, paged attention
void bind_dist(nanobind::module_& m);    // dist.cpp   : tensor-parallel communicators
void bind_engine(nanobind::module_& m);  // engine.cpp : model + engine
void bind_kernels(nanobind::module_& m);  // kernels.cpp : the kernel registries
void bind_cuda(nanobind::module_& m);    // cuda.cpp   : GPU-only entry points and device info
}  // namespace lowbit::bindings
