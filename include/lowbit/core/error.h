// lowbit's one error model: every failure is a lowbit::Error with a kind and a message that names
// the op, the argument, and what was expected versus what was given. The bindings map kinds onto
// Python exception types (ValueError, TypeError, MemoryError, NotImplementedError, RuntimeError).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace lowbit {

enum class ErrorKind {
  kValue,         // bad argument value or shape        -> ValueError
  kType,          // wrong dtype / device kind           -> TypeError
  kOutOfMemory,   // allocator or KV pool exhausted      -> MemoryError
  kNotSupported,  // no kernel / format for this combo   -> NotImplementedError
  kIndex,         // index out of range                  -> IndexError
  kRuntime,       // anything else (CUDA errors, I/O)    -> RuntimeError
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, const char* file, int line, const Args&... args) {
  std::ostringstream os;
  append(os, args...);
  (void)file;
  (void)line;
  throw Error(kind, os.str());
}
}  // namespace detail

// Streams all arguments into the message: LOWBIT_CHECK(x.dim() == 2, "gemm: x must be 2-D, got ", x.dim(), "-D")
#define LOWBIT_CHECK_KIND(kind, cond, ...)                                          \
  do {                                                                              \
    if (!(cond)) ::lowbit::detail::fail(kind, __FILE__, __LINE__, __VA_ARGS__);     \
  } while (0)
#define LOWBIT_CHECK(cond, ...) LOWBIT_CHECK_KIND(::lowbit::ErrorKind::kValue, cond, __VA_ARGS__)
#define LOWBIT_CHECK_TYPE(cond, ...) LOWBIT_CHECK_KIND(::lowbit::ErrorKind::kType, cond, __VA_ARGS__)
#define LOWBIT_FAIL(kind, ...) ::lowbit::detail::fail(kind, __FILE__, __LINE__, __VA_ARGS__)
#define LOWBIT_NOT_SUPPORTED(...) LOWBIT_FAIL(::lowbit::ErrorKind::kNotSupported, __VA_ARGS__)

}  // namespace lowbit
