// Communicator bindings (dist/communicator.h): the groups that Model.set_tensor_parallel takes. The
// collectives themselves run inside the C++ forward, on the engine's rank threads.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/bind.h"
#include "lowbit/dist/communicator.h"

namespace nb = nanobind;

namespace lowbit::bindings {

void bind_dist(nb::module_& m) {
  nb::class_<Communicator>(m, "Communicator", "One rank of a tensor-parallel group (threads or NCCL)")
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("world_size", &Communicator::world_size)
      .def_prop_ro("backend", &Communicator::backend)
      .def_prop_ro("capturable", &Communicator::capturable)
      .def("__repr__", [](const Communicator& c) {
        return "Communicator(backend=" + c.backend() + ", rank=" + std::to_string(c.rank()) +
               ", world_size=" + std::to_string(c.world_size()) + ")";
      });
  m.def("make_thread_communicators", &make_thread_communicators, nb::arg("world"),
        "A group of `world` ranks over threads of this process (host or GPU tensors; not capturable in graphs)");
  m.def("make_nccl_communicators", &make_nccl_communicators, nb::arg("devices"),
        "One NCCL rank per CUDA device ordinal in `devices`, all in this process");
  m.def(
      "nccl_available",
      [] {
        std::string why;
        const bool ok = nccl_available(&why);
        return nb::make_tuple(ok, why);
      },
      "(available, why not): whether this build can make NCCL communicators");
}

}  // namespace lowbit::bindings
