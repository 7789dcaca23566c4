// Helpers of the reference library: read any strided tensor of any declared dtype into a dense
// row-major buffer of doubles (broadcast to a wanted shape), write a dense buffer back through the
// output's own strides and dtype, and turn C++ errors into DIOPI error codes. Kernels then compute
// in double on dense buffers: slow, simple, and easy for a vendor to check its own kernels against.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "diopi/functions.h"

namespace diopi_ref {

using Shape = std::vector<int64_t>;
using Buffer = std::vector<double>;

struct Failure {
  diopiError_t code;
  std::string message;
};

[[noreturn]] void fail(diopiError_t code, const std::string& message);
void set_last_error(const std::string& message);

// The symbol of the kernel running on this thread (set by guarded), or nullptr. WRITE names the kernel
// by it: inside a kernel's lambda __func__ is the lambda's operator(), not the kernel.
const char*& current_kernel();
inline const char* kernel_name(const char* fallback) { return current_kernel() ? current_kernel() : fallback; }
// Whether a test build plants `symbol` wrong (DIOPI_REF_PLANT_WRONG: comma-separated symbols); false otherwise.
bool planted_wrong(const char* symbol);

// Runs a kernel body; a Failure or any exception becomes an error code plus diopi_last_error().
template <class Body>
diopiError_t guarded(const char* symbol, Body&& body) {
  struct Scope {
    const char* previous;
    explicit Scope(const char* s) : previous(current_kernel()) { current_kernel() = s; }
    ~Scope() { current_kernel() = previous; }
  } scope(symbol);
  try {
    body();
    return DIOPI_SUCCESS;
  } catch (const Failure& f) {
    set_last_error(std::string(symbol) + ": " + f.message);
    return f.code;
  } catch (const std::exception& e) {
    set_last_error(std::string(symbol) + ": " + e.what());
    return DIOPI_ERR_INTERNAL;
  }
}

Shape shape_of(diopiConstTensorHandle_t t);
int64_t numel(const Shape& shape);
std::string to_string(const Shape& shape);
Shape broadcast_shapes(const Shape& a, const Shape& b);
int64_t normalize_dim(int64_t dim, int64_t ndim);

// Argument checks: present, a floating dtype, an index dtype (int32/int64), an exact shape.
diopiConstTensorHandle_t need(diopiConstTensorHandle_t t, const char* name);
void require_float(std::initializer_list<diopiConstTensorHandle_t> tensors);
void require_index(diopiConstTensorHandle_t t, const char* name);
void require_shape(diopiConstTensorHandle_t t, const Shape& shape, const char* name);

Buffer read(diopiConstTensorHandle_t t);
Buffer read(diopiConstTensorHandle_t t, const Shape& as_shape);  // broadcast like torch
std::vector<int64_t> read_index(diopiConstTensorHandle_t t);
void write_output(diopiTensorHandle_t t, const Buffer& values, const char* symbol);

// Maps every element of `shape` to its slot in the reduction over `dims` (empty: all dims).
struct Reduction {
  Shape out_shape;          // with keepdim
  Shape out_shape_squeezed; // without
  std::vector<int64_t> slot;  // filled only with_slots
  Shape slot_strides;          // per input dim, the step of its slot (0 for a reduced dim)
  int64_t group_size = 1;
};
Reduction reduction(const Shape& shape, const std::vector<int64_t>& dims, bool with_slots = true);

// outer x length x inner split around one dim, for softmax-like kernels.
struct Split {
  int64_t outer, length, inner;
};
Split split_at(const Shape& shape, int64_t dim);

}  // namespace diopi_ref

// Every kernel writes its results through WRITE so that a test build can plant one wrong kernel
// (DIOPI_REF_PLANT_WRONG=<symbol>) without touching the kernel's code.
#define WRITE(tensor, values) ::diopi_ref::write_output((tensor), (values), ::diopi_ref::kernel_name(__func__))
