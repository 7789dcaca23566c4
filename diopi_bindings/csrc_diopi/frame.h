// The arguments of one routed call: the ATen operator's boxed arguments on the stack, read as the DIOPI
// parameter each fills (the generated trampolines in dispatch_table.gen.cpp call these accessors). A tensor
// handle is the address of an at::Tensor that outlives the call (diopirt.cpp reads it back).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/stack.h>
#include <diopi/functions.h>

#include <array>
#include <deque>
#include <mutex>
#include <vector>

struct diopiContext {
  c10::Device device{c10::DeviceType::PrivateUse1, 0};
  diopiStreamHandle_t stream = nullptr;  // the calling thread's current stream (NULL: the device has none)
  std::deque<at::Tensor> required;       // diopiRequireTensor/Buffer; freed when the call ends
};

namespace diopi_bindings {

inline diopiTensorHandle_t handle(at::Tensor& t) { return reinterpret_cast<diopiTensorHandle_t>(&t); }
inline const at::Tensor& tensor(diopiConstTensorHandle_t h) { return *reinterpret_cast<const at::Tensor*>(h); }
inline at::Tensor& tensor(diopiTensorHandle_t h) { return *reinterpret_cast<at::Tensor*>(h); }

diopiDtype_t to_diopi(c10::ScalarType type);  // diopi_dtype_unsupported where DIOPI has none
c10::ScalarType from_diopi(diopiDtype_t type);  // throws on a dtype torch has not

class Frame {
 public:
  Frame(diopiContext* ctx, torch::jit::Stack& stack, size_t first, std::vector<at::Tensor>& outs)
      : ctx_(ctx), stack_(stack), first_(first), outs_(outs) {}

  diopiContextHandle_t ctx() { return ctx_; }
  diopiTensorHandle_t out(size_t i) { return handle(outs_.at(i)); }
  diopiTensorHandle_t mut(size_t i) { return handle(arg(i).toTensor()); }
  diopiConstTensorHandle_t in(size_t i) {
    c10::IValue& v = arg(i);
    return v.isTensor() && v.toTensor().defined() ? handle(v.toTensor()) : nullptr;
  }
  const diopiScalar_t* scalar(size_t i);
  const diopiScalar_t* constant(double value);  // a float64 scalar the table writes (zero_: fill with 0.0)
  int64_t i64(size_t i) { return arg(i).toInt(); }
  double f64(size_t i) { return arg(i).toDouble(); }
  float f32(size_t i) { return static_cast<float>(arg(i).toDouble()); }
  // An absent bool? is true: the table's only one is native_dropout's train, which ATen reads None as training.
  bool boolean(size_t i) { return arg(i).isNone() || arg(i).toBool(); }
  // ATen's reduction int (0 none, 1 mean, 2 sum) is DIOPI's numbering
  diopiReduction_t reduction(size_t i) { return static_cast<diopiReduction_t>(arg(i).toInt()); }
  diopiSize_t size(size_t i);  // None: empty
  diopiConstTensorHandle_t* tensors(size_t i);  // a tensor list (None entries NULL)
  int64_t count(size_t i) { return static_cast<int64_t>(arg(i).toListRef().size()); }
  // [NULL] * dim + [index]: the indices of an index_put that adds along dim (dim normalised by argument 0's rank).
  diopiConstTensorHandle_t* at(size_t index, size_t dim);
  int64_t at_count(size_t dim) { return normalized_dim(dim) + 1; }
  double number(size_t i) { return arg(i).toScalar().toDouble(); }  // a Scalar or number argument
  // A Generator? argument (None: the device's default generator), locked for the call.
  diopiGeneratorHandle_t generator(size_t i);
  diopiGeneratorHandle_t default_generator();
  // Unlocks the generators: a declined call drew nothing, and the CPU fallback lends them to the CPU.
  void release_generators() { locks_.clear(); }
  // A result the library allocates: where it stores the handle. Read back by result(i) after the call.
  diopiTensorHandle_t* allocated(size_t i);
  const at::Tensor* result(size_t i) const;  // null when the library allocated no result i

 private:
  c10::IValue& arg(size_t i) { return stack_[first_ + i]; }
  int64_t normalized_dim(size_t dim) {
    const int64_t d = arg(dim).toInt();
    return d < 0 ? d + arg(0).toTensor().dim() : d;
  }
  diopiContext* ctx_;
  torch::jit::Stack& stack_;
  size_t first_;
  std::vector<at::Tensor>& outs_;
  std::array<diopiScalar_t, 8> scalars_{};
  size_t scalar_count_ = 0;
  std::deque<std::vector<int64_t>> lists_;
  std::deque<std::vector<diopiConstTensorHandle_t>> handles_;
  std::array<diopiTensorHandle_t, 4> allocated_{};
  std::deque<at::Generator> generators_;
  std::deque<std::unique_lock<std::mutex>> locks_;  // released before generators_ goes
};

struct Route {
  const char* name;      // "aten::add"
  const char* overload;  // "Tensor", "" for the default overload
  const char* diopi;     // "diopiAdd"
  diopiError_t (*call)(void* fn, Frame& f);
};
extern const Route kRoutes[];
extern const size_t kRouteCount;

}  // namespace diopi_bindings
