#include "bindings/bind.h"

namespace lowbit::bindings {
void bind_engine(nanobind::module_& m) {}
}  // namespace lowbit::bindings
