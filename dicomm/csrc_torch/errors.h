// Errors of the torch backend: c10::DistBackendError (what torch, DDP and users catch for any
// backend), tagged with the engine's error kind so Python raises dicomm's matching class.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace dicomm::torch_backend {

enum class Kind { kGeneric, kTimeout, kPeer, kMismatch, kValue };

class BackendError : public c10::DistBackendError {
 public:
  BackendError(Kind kind, const std::string& msg)
      : c10::DistBackendError(c10::SourceLocation{__func__, __FILE__, __LINE__}, msg), kind(kind) {}
  const Kind kind;
};

[[noreturn]] void fail(Kind kind, const std::string& msg);
// A bad argument: ValueError in Python, naming the operation.
[[noreturn]] void bad_argument(const std::string& op, const std::string& msg);

// Runs `f`, turning an engine exception into a BackendError of the same kind. Timeouts say
// "Timed out", as torch's suite and users' log filters expect.
std::exception_ptr as_backend_error(std::exception_ptr e);
template <typename F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const BackendError&) {
    throw;
  } catch (...) {
    std::rethrow_exception(as_backend_error(std::current_exception()));
  }
}

}  // namespace dicomm::torch_backend
