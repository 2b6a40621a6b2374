#include "bindings/bind.h"

namespace lowbit::bindings {
void bind_kv(nanobind::module_& m) {}
}  // namespace lowbit::bindings
