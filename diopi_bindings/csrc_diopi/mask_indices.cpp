#include "mask_indices.h"

#include <ATen/ATen.h>
#include <ATen/native/IndexingUtils.h>

#include <optional>

namespace diopi_bindings {

namespace {

bool is_mask(const c10::IValue& v) {
  if (!v.isTensor()) return false;
  const c10::ScalarType dtype = v.toTensor().scalar_type();
  return dtype == c10::ScalarType::Bool || dtype == c10::ScalarType::Byte;
}

// The tensor the indices index: the operator's `self`.
const at::Tensor* indexed_tensor(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first) {
  const std::optional<int> self = schema.argumentIndexWithName("self");
  if (!self || !stack[first + *self].isTensor()) return nullptr;
  return &stack[first + *self].toTensor();
}

}  // namespace

void expand_index_masks(const c10::FunctionSchema& schema, torch::jit::Stack& stack, size_t first) {
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    c10::IValue& arg = stack[first + i];
    if (!arg.isList() || *schema.arguments()[i].type() != *c10::ListType::create(c10::OptionalType::ofTensor())) continue;
    bool has_mask = false;
    for (const c10::IValue& entry : arg.toListRef()) has_mask = has_mask || is_mask(entry);
    if (!has_mask) continue;
    const at::Tensor* self = indexed_tensor(schema, stack, first);
    if (self == nullptr) continue;
    const c10::List<std::optional<at::Tensor>> masks = arg.toOptionalTensorList();
    c10::List<std::optional<at::Tensor>> indices;
    for (at::Tensor& index : at::native::expandTensors(*self, masks)) {
      indices.push_back(index.defined() ? std::optional<at::Tensor>(std::move(index)) : std::nullopt);
    }
    arg = c10::IValue(std::move(indices));
  }
}

}  // namespace diopi_bindings
