#include "bindings/bind.h"

namespace lowbit::bindings {
void bind_cuda(nanobind::module_& m) {}
}  // namespace lowbit::bindings
