#include "bindings/bind.h"

namespace lowbit::bindings {
void bind_attention(nanobind::module_& m) {}
}  // namespace lowbit::bindings
