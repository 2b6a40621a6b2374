#include "bindings/bind.h"

namespace lowbit::bindings {
void bind_ops(nanobind::module_& m) {}
}  // namespace lowbit::bindings
