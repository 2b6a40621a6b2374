// Communicator bindings (dist/communicator.h): the groups that Model.set_tensor_parallel takes. The
// collectives themselves run inside the C++ forward, on the engine's rank threads.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>

#include "bindings/bind.h"
#include "bindings/tensor_arg.h"
#include "lowbit/dist/communicator.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/stream.h"
#endif

namespace nb = nanobind;

namespace lowbit::bindings {

void bind_dist(nb::module_& m) {
  nb::class_<Communicator>(m, "Communicator", "One rank of a tensor-parallel group (threads or NCCL)")
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("world_size", &Communicator::world_size)
      .def_prop_ro("backend", &Communicator::backend)
      .def_prop_ro("capturable", &Communicator::capturable)
      .def_prop_ro("all_reduce", &Communicator::all_reduce_name, "What all_reduce_sum runs on")
      .def(
          "all_reduce_sum",
          [](Communicator& c, nb::handle t, uintptr_t stream) {
            Tensor x = tensor_from_python(t, "t");
            nb::gil_scoped_release release;  // the ranks' calls meet each other (one Python thread per rank)
#ifdef LOWBIT_WITH_CUDA
            if (stream) {
              cuda::StreamScope scope(reinterpret_cast<cudaStream_t>(stream));
              c.all_reduce_sum(x);
              return;
            }
#endif
            c.all_reduce_sum(x);
          },
          nb::arg("t"), nb::arg("stream") = 0,
          "In place: t = sum over ranks (for tests and benchmarks; the engine calls it inside the forward). `stream`: "
          "a cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream; 0 = lowbit's current stream). "
          "Drive each rank from its own thread, as with NCCL: a rank's collective waits on the GPU for its peers")
      .def(
          "all_reduce_add_rms_norm",
          [](Communicator& c, nb::handle partial, nb::handle residual, nb::handle weight, float eps, nb::handle out,
             nb::handle q, nb::handle scales, uintptr_t stream) {
            auto opt = [](nb::handle h, const char* name) {
              return h.is_none() ? Tensor() : tensor_from_python(h, name);
            };
            const Tensor p = tensor_from_python(partial, "partial"), w = tensor_from_python(weight, "weight");
            Tensor r = tensor_from_python(residual, "residual"), o = opt(out, "out"), qq = opt(q, "q"),
                   s = opt(scales, "scales");
            nb::gil_scoped_release release;
#ifdef LOWBIT_WITH_CUDA
            if (stream) {
              cuda::StreamScope scope(reinterpret_cast<cudaStream_t>(stream));
              return c.all_reduce_add_rms_norm(p, r, w, eps, o, qq, s);
            }
#endif
            return c.all_reduce_add_rms_norm(p, r, w, eps, o, qq, s);
          },
          nb::arg("partial"), nb::arg("residual"), nb::arg("weight"), nb::arg("eps"),
          nb::arg("out").none() = nb::none(), nb::arg("q").none() = nb::none(),
          nb::arg("scales").none() = nb::none(), nb::arg("stream") = 0,
          "residual += sum over ranks of partial, then out = rms_norm(residual) * weight (or the per-token codes q and "
          "scales of that output when out is None), in one kernel; returns False, touching nothing, when this group "
          "does not fuse these shapes (the model then all-reduces and normalizes in two steps). For tests")
      .def("__repr__", [](const Communicator& c) {
        return "Communicator(backend=" + c.backend() + ", rank=" + std::to_string(c.rank()) +
               ", world_size=" + std::to_string(c.world_size()) + ")";
      });
  m.def("make_thread_communicators", &make_thread_communicators, nb::arg("world"),
        "A group of `world` ranks over threads of this process (host or GPU tensors; not capturable in graphs)");
  m.def("make_nccl_communicators", &make_nccl_communicators, nb::arg("devices"), nb::arg("oneshot_max_bytes") = -1,
        "One NCCL rank per CUDA device ordinal in `devices`, all in this process. All-reduces of <= oneshot_max_bytes "
        "take a one-shot kernel over peer memory when the GPUs have peer access (0: NCCL only; -1: the default, "
        "or LOWBIT_TP_ONESHOT=0 / LOWBIT_TP_ONESHOT_MAX_BYTES=n from the environment)");
  m.attr("ONESHOT_DEFAULT_BYTES") = kOneShotDefaultBytes;
  m.attr("ONESHOT_CAPACITY_BYTES") = kOneShotCapacityBytes;
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
