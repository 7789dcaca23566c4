// The project's own operator ABI (include/diopi: functions named diopi_aten_<name>, a visible tensor struct, a
// context with allocator callbacks), in a namespace of its own: this module's diopi/diopirt.h is DeepLink's
// (frame.h), whose types have the same names. A translation unit includes one of the two, never both.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <cstddef>

namespace diopi_bindings::own_abi {

#include "../include/diopi/functions.h"

// One ABI argument of a call, as the generated trampolines (own_calls.gen.cpp) read it: a tensor handle (or,
// for an out* output, where the library stores the handle it allocated), a list (tensor handles or int64s),
// or a number.
struct OwnArg {
  void* pointer = nullptr;
  const void* items = nullptr;
  int64_t length = 0;
  double real = 0.0;
  int64_t integer = 0;
  bool flag = false;
};

struct OwnCall {
  const char* aten;    // "aten::add.Tensor": the schema operator (diopi_bindings/schema.py)
  const char* symbol;  // "diopi_aten_add_Tensor"
  int (*call)(void* fn, void* ctx, const OwnArg* args);
};
extern const OwnCall kOwnCalls[];  // in the schema's order
extern const size_t kOwnCallCount;

}  // namespace diopi_bindings::own_abi
