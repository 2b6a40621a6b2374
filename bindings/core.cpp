// Tensor, DLPack exchange, devices and allocator statistics.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/bind.h"
#include "bindings/tensor_arg.h"
#include "lowbit/core/allocator.h"
#include "lowbit/core/dlpack.h"
#include "lowbit/core/tensor.h"

namespace nb = nanobind;

namespace lowbit::bindings {
namespace {

void capsule_destructor(PyObject* cap) {
  // Only a capsule nobody consumed still owns its tensor (consumers rename it "used_dltensor").
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  } else {
    PyErr_Clear();
  }
}

void versioned_capsule_destructor(PyObject* cap) {
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    if (m && m->deleter) m->deleter(m);
  } else {
    PyErr_Clear();
  }
}

// Consumers that pass max_version >= (1, 0) get the versioned (writable) form; others the legacy one.
bool wants_versioned(nb::handle max_version) {
  if (max_version.is_none()) return false;
  int major = 0;
  const bool ok = nb::isinstance<nb::tuple>(max_version) && nb::len(max_version) == 2 &&
                  nb::try_cast<int>(max_version[0], major);
  if (!ok)
    LOWBIT_FAIL(ErrorKind::kType, "__dlpack__: argument 'max_version' must be None or a (major, minor) tuple of ints, "
                "got ", nb::repr(max_version).c_str());
  return major >= 1;
}

nb::object to_versioned_capsule(const Tensor& t) {
  DLManagedTensorVersioned* m = to_dlpack_versioned(t);
  PyObject* cap = PyCapsule_New(m, "dltensor_versioned", versioned_capsule_destructor);
  if (!cap) {
    m->deleter(m);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

nb::object to_capsule(const Tensor& t) {
  DLManagedTensor* m = to_dlpack(t);
  PyObject* cap = PyCapsule_New(m, "dltensor", capsule_destructor);
  if (!cap) {
    m->deleter(m);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

nb::tuple shape_tuple(const Shape& s) {
  nb::list l;
  for (int64_t d : s) l.append(d);
  return nb::tuple(l);
}

}  // namespace

Tensor tensor_from_python(nb::handle obj, const char* arg) {
  if (nb::isinstance<Tensor>(obj)) return nb::cast<Tensor>(obj);
  nb::object cap;
  if (PyCapsule_CheckExact(obj.ptr())) {
    cap = nb::borrow(obj);
  } else if (nb::hasattr(obj, "__dlpack__")) {
    cap = obj.attr("__dlpack__")();
    if (!PyCapsule_CheckExact(cap.ptr()))
      LOWBIT_FAIL(ErrorKind::kType, "argument '", arg, "': ", nb::type_name(obj.type()).c_str(),
                  ".__dlpack__() returned ", nb::type_name(cap.type()).c_str(), ", not a DLPack capsule");
  } else {
    LOWBIT_FAIL(ErrorKind::kType, "argument '", arg, "': expected a lowbit.Tensor or an object supporting DLPack "
                "(torch.Tensor, numpy.ndarray), got ", nb::type_name(obj.type()).c_str());
  }
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  if (!m) {
    PyErr_Clear();
    LOWBIT_FAIL(ErrorKind::kType, "argument '", arg, "': DLPack capsule was already consumed or is versioned");
  }
  PyCapsule_SetName(cap.ptr(), "used_dltensor");
  try {
    return from_dlpack(m);
  } catch (const Error& e) {  // e.g. an unsupported dtype: say which argument carried it
    throw Error(e.kind(), std::string("argument '") + arg + "': " + e.what());
  }
}

void bind_core(nb::module_& m) {
  nb::class_<Tensor>(m, "Tensor", "A lowbit tensor: shares memory with torch/numpy through DLPack")
      .def_prop_ro("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_prop_ro("strides", [](const Tensor& t) { return shape_tuple(t.strides()); })
      .def_prop_ro("dtype", [](const Tensor& t) { return std::string(name_of(t.dtype())); })
      .def_prop_ro("device", [](const Tensor& t) { return t.device().str(); })
      .def_prop_ro("ndim", &Tensor::dim)
      .def_prop_ro("nbytes", &Tensor::nbytes)
      .def("numel", &Tensor::numel)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("contiguous", &Tensor::contiguous)
      .def("clone", &Tensor::clone)
      .def("to", [](const Tensor& t, const std::string& dev) { return t.to(Device::parse(dev)); }, nb::arg("device"))
      .def("view", &Tensor::view, nb::arg("shape"))
      .def("slice", &Tensor::slice, nb::arg("dim"), nb::arg("start"), nb::arg("end"))
      .def("view_as_bytes", [](const Tensor& t) { return t.as_dtype_view(ScalarType::u8); },
           "Reinterpret a contiguous tensor as raw u8 bytes (sub-byte types included)")
      .def("copy_", [](Tensor& t, nb::handle src) { t.copy_(tensor_from_python(src, "src")); return t; })
      .def("__dlpack__",
           [](const Tensor& t, nb::handle stream, nb::handle max_version, nb::handle dl_device, nb::handle copy) {
             return wants_versioned(max_version) ? to_versioned_capsule(t) : to_capsule(t);
           },
           nb::arg("stream") = nb::none(), nb::arg("max_version") = nb::none(), nb::arg("dl_device") = nb::none(),
           nb::arg("copy") = nb::none())
      .def("__dlpack_device__",
           [](const Tensor& t) {
             return nb::make_tuple(t.device().is_cpu() ? int(kDLCPU) : int(kDLCUDA),
                                   t.device().is_cpu() ? 0 : t.device().index);
           })
      .def("__repr__", &Tensor::str);

  m.def("from_dlpack", [](nb::handle obj) { return tensor_from_python(obj, "obj"); }, nb::arg("obj"),
        "Zero-copy view of a DLPack-capable object (torch.Tensor, numpy.ndarray) as a lowbit.Tensor");
  m.def("empty",
        [](const std::vector<int64_t>& shape, const std::string& dtype, const std::string& device) {
          return Tensor::empty(shape, scalar_type_from_name(dtype), Device::parse(device));
        },
        nb::arg("shape"), nb::arg("dtype") = "f32", nb::arg("device") = "cpu");
  m.def("cuda_available", &cuda_available, "True when lowbit was built with CUDA and a GPU is visible");
  m.def("cuda_device_count", &cuda_device_count);
  m.def("has_cuda_build", []() {
#ifdef LOWBIT_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def("scalar_type_bits", [](const std::string& n) { return bits_of(scalar_type_from_name(n)); });
  m.def("allocator_stats", [](const std::string& dev) {
    const AllocatorStats s = allocator_for(Device::parse(dev)).stats();
    nb::dict d;
    d["allocated_bytes"] = s.allocated_bytes;
    d["reserved_bytes"] = s.reserved_bytes;
    d["peak_allocated_bytes"] = s.peak_allocated_bytes;
    d["num_allocs"] = s.num_allocs;
    d["num_system_allocs"] = s.num_system_allocs;
    return d;
  }, nb::arg("device") = "cpu");
  m.def(
      "empty_cache",
      [](const std::string& dev) {
        Allocator& a = allocator_for(Device::parse(dev));
        const size_t before = a.stats().reserved_bytes;
        a.empty_cache();
        return before - a.stats().reserved_bytes;
      },
      nb::arg("device") = "cuda",
      "Returns the device's cached free blocks to the driver (blocks in use stay); the bytes released. lowbit "
      "keeps freed GPU blocks for reuse, so after an LLM is gone its memory stays reserved until this call or "
      "until an allocation fails");
}

}  // namespace lowbit::bindings
