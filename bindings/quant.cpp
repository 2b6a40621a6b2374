#include "bindings/bind.h"

namespace lowbit::bindings {
void bind_quant(nanobind::module_& m) {}
}  // namespace lowbit::bindings
