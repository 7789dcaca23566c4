// Registers the generated routes of the attached library on PrivateUse1 and reports their counts.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <dlfcn.h>

#include <cstdint>
#include <string>
#include <vector>

namespace diopi_bindings {

// Registers a kernel for every route whose DIOPI function `library` (a dlopen handle) exports; returns the
// ATen overloads registered. Once per process.
std::vector<std::string> register_routes(void* library, const char* (*last_error)());

struct RouteCount {
  std::string aten;
  std::string diopi;
  int64_t routed;
  int64_t fallback;
};
std::vector<RouteCount> route_counts();  // the routes called so far

// The results of a call as the meta kernel gives them (sizes, strides, dtype; not defined for an absent
// optional result), cached per (key, argument shapes, strides, dtypes, ints, bools, lists): a training loop pays
// the meta kernel, often Python, once per distinct call. `key` tells callers apart (a route's index; the own-ABI
// routes use their own range).
struct ResultMeta {
  bool defined = true;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};
std::vector<ResultMeta> result_meta(const c10::OperatorHandle& op, int64_t key, const torch::jit::Stack& stack,
                                    size_t first);

}  // namespace diopi_bindings

namespace torch {
class Library;
}

namespace diopi_bindings {

// aten::_safe_softmax composed of routed operators (safe_softmax.cpp), when the library exports them.
bool register_safe_softmax(torch::Library& lib, void* library);
int64_t safe_softmax_calls();

}  // namespace diopi_bindings
