// lowbit._core: the nanobind extension. Each C++ area binds itself in its own file; this file only
// wires them together and translates lowbit::Error into the matching Python exception.
#include <nanobind/nanobind.h>

#include "bindings/bind.h"
#include "lowbit/core/error.h"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "lowbit C++ core (tensors, quant formats, paged KV, kernels, engine)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const lowbit::Error& e) {
      PyObject* type = PyExc_RuntimeError;
      switch (e.kind()) {
        case lowbit::ErrorKind::kValue: type = PyExc_ValueError; break;
        case lowbit::ErrorKind::kType: type = PyExc_TypeError; break;
        case lowbit::ErrorKind::kOutOfMemory: type = PyExc_MemoryError; break;
        case lowbit::ErrorKind::kNotSupported: type = PyExc_NotImplementedError; break;
        case lowbit::ErrorKind::kIndex: type = PyExc_IndexError; break;
        case lowbit::ErrorKind::kRuntime: type = PyExc_RuntimeError; break;
      }
      PyErr_SetString(type, e.what());
    }
  });
  lowbit::bindings::bind_core(m);
  lowbit::bindings::bind_quant(m);
  lowbit::bindings::bind_kv(m);
  lowbit::bindings::bind_ops(m);
  lowbit::bindings::bind_attention(m);
  lowbit::bindings::bind_dist(m);
  lowbit::bindings::bind_engine(m);
  lowbit::bindings::bind_kernels(m);
  lowbit::bindings::bind_cuda(m);
}
