// The runtime half of DIOPI (diopirt.h), implemented over at::Tensor: what a library calls to read a
// tensor handle, ask for memory on the call's device, and reach a generator. Exported with default
// visibility; module.cpp makes this module's symbols global before it loads a library, so the library's
// undefined references bind here. No exception crosses into the library: a failure is diopiErrorOccurred.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include "frame.h"

namespace diopi_bindings {

diopiDtype_t to_diopi(c10::ScalarType type) {
  switch (type) {
    case c10::kChar: return diopi_dtype_int8;
    case c10::kByte: return diopi_dtype_uint8;
    case c10::kShort: return diopi_dtype_int16;
    case c10::kUInt16: return diopi_dtype_uint16;
    case c10::kInt: return diopi_dtype_int32;
    case c10::kUInt32: return diopi_dtype_uint32;
    case c10::kLong: return diopi_dtype_int64;
    case c10::kUInt64: return diopi_dtype_uint64;
    case c10::kHalf: return diopi_dtype_float16;
    case c10::kFloat: return diopi_dtype_float32;
    case c10::kDouble: return diopi_dtype_float64;
    case c10::kBool: return diopi_dtype_bool;
    case c10::kBFloat16: return diopi_dtype_bfloat16;
    case c10::kComplexHalf: return diopi_dtype_complex32;
    case c10::kComplexFloat: return diopi_dtype_complex64;
    case c10::kComplexDouble: return diopi_dtype_complex128;
    default: return diopi_dtype_unsupported;
  }
}

c10::ScalarType from_diopi(diopiDtype_t type) {
  switch (type) {
    case diopi_dtype_int8: return c10::kChar;
    case diopi_dtype_uint8: return c10::kByte;
    case diopi_dtype_int16: return c10::kShort;
    case diopi_dtype_uint16: return c10::kUInt16;
    case diopi_dtype_int32: return c10::kInt;
    case diopi_dtype_uint32: return c10::kUInt32;
    case diopi_dtype_int64: return c10::kLong;
    case diopi_dtype_uint64: return c10::kUInt64;
    case diopi_dtype_float16: return c10::kHalf;
    case diopi_dtype_float32: return c10::kFloat;
    case diopi_dtype_float64: return c10::kDouble;
    case diopi_dtype_bool: return c10::kBool;
    case diopi_dtype_bfloat16: return c10::kBFloat16;
    case diopi_dtype_complex32: return c10::kComplexHalf;
    case diopi_dtype_complex64: return c10::kComplexFloat;
    case diopi_dtype_complex128: return c10::kComplexDouble;
    default: TORCH_CHECK(false, "diopi: dtype ", static_cast<int>(type), " has no torch dtype");
  }
}

const diopiScalar_t* Frame::scalar(size_t i) {
  const c10::IValue& v = arg(i);
  if (v.isNone()) return nullptr;  // an absent Scalar? (clamp's min or max): DIOPI takes NULL
  TORCH_CHECK(scalar_count_ < scalars_.size(), "diopi: more than 8 scalar arguments");
  diopiScalar_t& s = scalars_[scalar_count_++];
  const c10::Scalar value = v.toScalar();
  if (value.isFloatingPoint()) {
    s.stype = diopi_dtype_float64;
    s.fval = value.toDouble();
  } else if (value.isBoolean()) {
    s.stype = diopi_dtype_bool;
    s.ival = value.toBool() ? 1 : 0;
  } else {
    TORCH_CHECK(value.isIntegral(false), "diopi: a complex scalar has no diopiScalar_t");
    s.stype = diopi_dtype_int64;
    s.ival = value.toLong();
  }
  return &s;
}

const diopiScalar_t* Frame::constant(double value) {
  TORCH_CHECK(scalar_count_ < scalars_.size(), "diopi: more than 8 scalar arguments");
  diopiScalar_t& s = scalars_[scalar_count_++];
  s.stype = diopi_dtype_float64;
  s.fval = value;
  return &s;
}

diopiSize_t Frame::size(size_t i) {
  const c10::IValue& v = arg(i);
  if (v.isNone()) return diopiSize_t{nullptr, 0};
  std::vector<int64_t>& list = lists_.emplace_back(v.toIntVector());
  return diopiSize_t{list.data(), static_cast<int64_t>(list.size())};
}

diopiConstTensorHandle_t* Frame::tensors(size_t i) {
  std::vector<diopiConstTensorHandle_t>& list = handles_.emplace_back();
  for (const c10::IValue& v : arg(i).toListRef()) {
    list.push_back(v.isTensor() && v.toTensor().defined() ? handle(const_cast<at::Tensor&>(v.toTensor())) : nullptr);
  }
  return list.data();
}

diopiConstTensorHandle_t* Frame::at(size_t index, size_t dim) {
  std::vector<diopiConstTensorHandle_t>& list = handles_.emplace_back(static_cast<size_t>(normalized_dim(dim)), nullptr);
  list.push_back(handle(arg(index).toTensor()));
  return list.data();
}

diopiGeneratorHandle_t Frame::generator(size_t i) {
  const c10::IValue& v = arg(i);
  if (v.isNone()) return default_generator();
  at::Generator& gen = generators_.emplace_back(v.toGenerator());
  locks_.emplace_back(gen.mutex());
  return reinterpret_cast<diopiGeneratorHandle_t>(&gen);
}

diopiGeneratorHandle_t Frame::default_generator() {
  at::Generator& gen = generators_.emplace_back(at::globalContext().defaultGenerator(ctx_->device));
  locks_.emplace_back(gen.mutex());
  return reinterpret_cast<diopiGeneratorHandle_t>(&gen);
}

diopiTensorHandle_t* Frame::allocated(size_t i) {
  TORCH_CHECK(i < allocated_.size(), "diopi: result ", i, " out of range");
  return &allocated_[i];
}

const at::Tensor* Frame::result(size_t i) const {
  return i < allocated_.size() && allocated_[i] != nullptr ? &tensor(allocated_[i]) : nullptr;
}

}  // namespace diopi_bindings

using diopi_bindings::tensor;

namespace {

template <class Fn>
diopiError_t guarded(Fn&& fn) noexcept {
  try {
    fn();
    return diopiSuccess;
  } catch (...) {
    return diopiErrorOccurred;
  }
}

}  // namespace

extern "C" {

DIOPI_RT_API diopiError_t diopiGetTensorData(diopiTensorHandle_t th, void** data) {
  if (th == nullptr || data == nullptr) return diopiErrorOccurred;
  return guarded([&] { *data = tensor(th).data_ptr(); });
}

DIOPI_RT_API diopiError_t diopiGetTensorDataConst(diopiConstTensorHandle_t th, const void** data) {
  if (th == nullptr || data == nullptr) return diopiErrorOccurred;
  return guarded([&] { *data = tensor(th).const_data_ptr(); });
}

DIOPI_RT_API diopiError_t diopiGetTensorShape(diopiConstTensorHandle_t th, diopiSize_t* size) {
  if (th == nullptr || size == nullptr) return diopiErrorOccurred;
  const c10::IntArrayRef s = tensor(th).sizes();
  *size = diopiSize_t{s.data(), static_cast<int64_t>(s.size())};
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiGetTensorStride(diopiConstTensorHandle_t th, diopiSize_t* stride) {
  if (th == nullptr || stride == nullptr) return diopiErrorOccurred;
  const c10::IntArrayRef s = tensor(th).strides();
  *stride = diopiSize_t{s.data(), static_cast<int64_t>(s.size())};
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiGetTensorDtype(diopiConstTensorHandle_t th, diopiDtype_t* dtype) {
  if (th == nullptr || dtype == nullptr) return diopiErrorOccurred;
  *dtype = diopi_bindings::to_diopi(tensor(th).scalar_type());
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiGetTensorDevice(diopiConstTensorHandle_t th, diopiDevice_t* device) {
  if (th == nullptr || device == nullptr) return diopiErrorOccurred;
  *device = tensor(th).is_cpu() ? diopi_host : diopi_device;
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiGetTensorNumel(diopiConstTensorHandle_t th, int64_t* numel) {
  if (th == nullptr || numel == nullptr) return diopiErrorOccurred;
  *numel = tensor(th).numel();
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiGetTensorElemSize(diopiConstTensorHandle_t th, int64_t* itemsize) {
  if (th == nullptr || itemsize == nullptr) return diopiErrorOccurred;
  *itemsize = static_cast<int64_t>(tensor(th).element_size());
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiGetTensorStoragePtr(diopiConstTensorHandle_t th, void** storage) {
  if (th == nullptr || storage == nullptr) return diopiErrorOccurred;
  return guarded([&] { *storage = tensor(th).storage().mutable_data(); });
}

DIOPI_RT_API diopiError_t diopiGetTensorStorageOffset(diopiConstTensorHandle_t th, int64_t* offset) {
  if (th == nullptr || offset == nullptr) return diopiErrorOccurred;
  *offset = tensor(th).storage_offset();
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiGetTensorStorageNbytes(diopiConstTensorHandle_t th, size_t* nbytes) {
  if (th == nullptr || nbytes == nullptr) return diopiErrorOccurred;
  return guarded([&] { *nbytes = tensor(th).storage().nbytes(); });
}

DIOPI_RT_API diopiError_t diopiGetTensorDeviceIndex(diopiConstTensorHandle_t th, diopiDeviceIndex_t* index) {
  if (th == nullptr || index == nullptr) return diopiErrorOccurred;
  *index = static_cast<diopiDeviceIndex_t>(tensor(th).is_cpu() ? 0 : tensor(th).device().index());
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiGetStream(diopiContextHandle_t ctx, diopiStreamHandle_t* stream) {
  if (ctx == nullptr || stream == nullptr) return diopiErrorOccurred;
  *stream = ctx->stream;
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiRequireTensor(diopiContextHandle_t ctx, diopiTensorHandle_t* out, const diopiSize_t* size,
                                             const diopiSize_t* stride, const diopiDtype_t dtype,
                                             const diopiDevice_t device) {
  if (ctx == nullptr || out == nullptr || size == nullptr || (size->len > 0 && size->data == nullptr)) {
    return diopiErrorOccurred;
  }
  if (stride != nullptr && (stride->len != size->len || (stride->len > 0 && stride->data == nullptr))) {
    return diopiErrorOccurred;
  }
  return guarded([&] {
    const c10::IntArrayRef sizes(size->data, static_cast<size_t>(size->len));
    const auto options = at::TensorOptions()
                             .dtype(diopi_bindings::from_diopi(dtype))
                             .device(device == diopi_host ? c10::Device(c10::kCPU) : ctx->device);
    at::Tensor t = stride == nullptr
                       ? at::empty(sizes, options)
                       : at::empty_strided(sizes, c10::IntArrayRef(stride->data, static_cast<size_t>(stride->len)), options);
    *out = diopi_bindings::handle(ctx->required.emplace_back(std::move(t)));
  });
}

DIOPI_RT_API diopiError_t diopiRequireBuffer(diopiContextHandle_t ctx, diopiTensorHandle_t* out, int64_t num_bytes,
                                             diopiDevice_t device) {
  if (num_bytes < 0) return diopiErrorOccurred;
  const diopiSize_t size{&num_bytes, 1};
  return diopiRequireTensor(ctx, out, &size, nullptr, diopi_dtype_int8, device);
}

DIOPI_RT_API diopiError_t diopiGeneratorGetState(diopiContextHandle_t ctx, diopiConstGeneratorHandle_t th,
                                                 diopiTensorHandle_t* data) {
  if (ctx == nullptr || th == nullptr || data == nullptr) return diopiErrorOccurred;
  return guarded([&] {
    const auto& gen = *reinterpret_cast<const at::Generator*>(th);
    *data = diopi_bindings::handle(ctx->required.emplace_back(gen.get_state()));
  });
}

DIOPI_RT_API diopiError_t diopiGeneratorSetState(diopiGeneratorHandle_t th, diopiConstTensorHandle_t state) {
  if (th == nullptr || state == nullptr) return diopiErrorOccurred;
  return guarded([&] { reinterpret_cast<at::Generator*>(th)->set_state(tensor(state)); });
}

DIOPI_RT_API diopiError_t diopiGeneratorGetSeedAndOffset(diopiGeneratorHandle_t th, uint64_t* seed, uint64_t* offset) {
  if (th == nullptr || seed == nullptr || offset == nullptr) return diopiErrorOccurred;
  return guarded([&] {
    auto* gen = reinterpret_cast<at::Generator*>(th);
    *seed = gen->current_seed();
    *offset = gen->get_offset();
  });
}

DIOPI_RT_API diopiError_t diopiGeneratorSetSeedAndOffset(diopiGeneratorHandle_t th, uint64_t seed, uint64_t offset) {
  if (th == nullptr) return diopiErrorOccurred;
  return guarded([&] {
    auto* gen = reinterpret_cast<at::Generator*>(th);
    gen->set_current_seed(seed);
    gen->set_offset(offset);
  });
}

DIOPI_RT_API diopiError_t diopiRecordStart(const char* record_name, void** record) {
  if (record != nullptr) *record = nullptr;
  return diopiSuccess;
}

DIOPI_RT_API diopiError_t diopiRecordEnd(void** record) { return diopiSuccess; }

}  // extern "C"
