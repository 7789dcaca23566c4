// Boolean (and uint8) masks in a routed operator's index list (index.Tensor, index.Tensor_out,
// _index_put_impl_: `Tensor?[] indices`) become long indices before the route runs, as ATen's own index kernels
// expand them (at::native::expandTensors): a k-dim mask is k index tensors, the columns of its nonzero. The
// nonzero runs where the mask lives (on the device: the library's, or the CPU through the fallback), so the
// result's shape is known when the meta kernel is asked (a mask's meta nonzero has no shape to give).
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>

namespace diopi_bindings {

// Rewrites the stack's index lists in place (the operator's arguments start at `first`).
void expand_index_masks(const c10::FunctionSchema& schema, torch::jit::Stack& stack, size_t first);

}  // namespace diopi_bindings
