// The point-to-point calls `dicomm._C` lends to other extension modules (the benchmark's native
// loops in `dicomm._C_bench`), as a versioned table of plain functions in the capsule
// `_C._native_p2p`: the borrowing module holds no engine of its own, and every call lands in the
// one engine that created the communicator.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>

#include "core/request.h"
#include "core/types.h"

namespace dicomm {

class Communicator;

struct NativeP2P {
  static constexpr uint32_t kVersion = 1;
  static constexpr const char* kCapsuleName = "dicomm._C._native_p2p";
  uint32_t version = kVersion;
  // The Communicator inside a `dicomm._C.Communicator` object (borrowed: the object keeps it alive);
  // throws ValueError when `obj` is not one.
  Communicator* (*unwrap)(PyObject* obj) = nullptr;
  int (*rank)(const Communicator& c) = nullptr;
  RequestPtr (*isend)(Communicator& c, const void* buf, size_t bytes, int peer, Tag tag) = nullptr;
  RequestPtr (*irecv)(Communicator& c, void* buf, size_t bytes, int peer, Tag tag) = nullptr;
};

}  // namespace dicomm
