// The reference library under DIOPI's names (libdiopi_reference_deeplink): each diopi* function of
// diopi_functions.yaml reads its DIOPI handles through the runtime's accessors and calls the reference kernel of
// the same operator (the project's own ABI, include/diopi, here in namespace legacy). bridge.gen.cpp is generated
// (python -m diopi_bindings.gen_reference_bridge); this header holds what every generated function shares.
#pragma once

#include <diopi/functions.h>

#undef DIOPI_API
namespace legacy {
#include "../../include/diopi/diopirt.h"
#include "../../include/diopi/functions.h"
}  // namespace legacy
#undef DIOPI_API
#define DIOPI_API DIOPI_ATTR_WEAK

#include <array>
#include <cstdint>
#include <forward_list>
#include <limits>
#include <vector>

namespace bridge {

// Up to N objects in place, more on the heap, none of them ever moved (the reference keeps pointers to them).
// A call converts a handful of arguments: no allocation per call in the common case (std::deque allocates
// even when empty).
template <class T, size_t N>
class Stable {
 public:
  T& add() {
    if (used_ < N) return inline_[used_++] = T{};
    return more_.emplace_front();
  }

 private:
  std::array<T, N> inline_{};
  size_t used_ = 0;
  std::forward_list<T> more_;
};

// The arguments of one call, converted: views of DIOPI tensors in the reference's struct, tensor lists,
// scalars made 0-dim tensors, and a reference context whose allocations go to diopiRequireTensor/Buffer.
class Call {
 public:
  explicit Call(diopiContextHandle_t ctx);
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  legacy::diopiTensor* view(diopiConstTensorHandle_t t);  // NULL stays NULL
  legacy::diopiTensorList_t list(const diopiConstTensorHandle_t* tensors, int64_t count);
  // A scalar as a 0-dim tensor of `like`'s dtype (a Python number's dtype under type promotion).
  legacy::diopiTensor* scalar_like(const diopiScalar_t* s, diopiConstTensorHandle_t like);
  bool keepdim(diopiConstTensorHandle_t out, diopiConstTensorHandle_t input);  // sum/mean: out kept the rank
  legacy::diopiContext* context() { return &lctx_; }
  diopiError_t status() const { return status_; }
  diopiError_t finish(legacy::diopiError_t code) const;  // the reference's code in DIOPI's numbering

  diopiContextHandle_t ctx;

 private:
  legacy::diopiContext lctx_{};
  Stable<legacy::diopiTensor, 8> views_;
  std::forward_list<std::vector<legacy::diopiConstTensorHandle_t>> lists_;
  Stable<double, 4> scalar_storage_;
  diopiError_t status_ = diopiSuccess;
};

double value(const diopiScalar_t* s, double absent);

// The shape of input[indices] (advanced indexing with integer index tensors; NULL entries are full slices).
// False (the call declines) for a boolean mask.
bool index_shape(diopiConstTensorHandle_t input, const diopiConstTensorHandle_t* indices, int64_t count,
                 std::vector<int64_t>& shape);

}  // namespace bridge

// float32 fast paths tried first (fast_matmul.cpp); diopiNoImplement: the reference kernel serves the call.
namespace fast {
diopiError_t diopiMm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                     diopiConstTensorHandle_t mat2);
diopiError_t diopiBmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t mat2);
diopiError_t diopiAddmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                        diopiConstTensorHandle_t mat1, diopiConstTensorHandle_t mat2, const diopiScalar_t* beta,
                        const diopiScalar_t* alpha);
}  // namespace fast
