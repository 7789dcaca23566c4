// What the generated DIOPI functions of the reference share (bridge.h).
#include "bridge.h"
#include "../float_bits.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace bridge {

namespace {

bool to_legacy(diopiDtype_t type, legacy::diopiDtype_t* out) {
  switch (type) {
    case diopi_dtype_bool: *out = legacy::DIOPI_DTYPE_BOOL; return true;
    case diopi_dtype_int32: *out = legacy::DIOPI_DTYPE_INT32; return true;
    case diopi_dtype_int64: *out = legacy::DIOPI_DTYPE_INT64; return true;
    case diopi_dtype_float16: *out = legacy::DIOPI_DTYPE_FLOAT16; return true;
    case diopi_dtype_bfloat16: *out = legacy::DIOPI_DTYPE_BFLOAT16; return true;
    case diopi_dtype_float32: *out = legacy::DIOPI_DTYPE_FLOAT32; return true;
    case diopi_dtype_float64: *out = legacy::DIOPI_DTYPE_FLOAT64; return true;
    default: return false;
  }
}

diopiDtype_t from_legacy(legacy::diopiDtype_t type) {
  switch (type) {
    case legacy::DIOPI_DTYPE_BOOL: return diopi_dtype_bool;
    case legacy::DIOPI_DTYPE_INT32: return diopi_dtype_int32;
    case legacy::DIOPI_DTYPE_INT64: return diopi_dtype_int64;
    case legacy::DIOPI_DTYPE_FLOAT16: return diopi_dtype_float16;
    case legacy::DIOPI_DTYPE_BFLOAT16: return diopi_dtype_bfloat16;
    case legacy::DIOPI_DTYPE_FLOAT32: return diopi_dtype_float32;
    default: return diopi_dtype_float64;
  }
}

void* allocate(void* state, int64_t nbytes) {
  auto* call = static_cast<Call*>(state);
  diopiTensorHandle_t t = nullptr;
  if (diopiRequireBuffer(call->ctx, &t, nbytes, diopi_device) != diopiSuccess) return nullptr;
  void* data = nullptr;
  diopiGetTensorData(t, &data);
  return data;
}

void release(void*, void*) {}  // the framework frees what the call required when the call ends

legacy::diopiError_t require_tensor(void* state, legacy::diopiTensorHandle_t* out, int64_t ndim, const int64_t* shape,
                                    legacy::diopiDtype_t dtype) {
  auto* call = static_cast<Call*>(state);
  const diopiSize_t size{shape, ndim};
  diopiTensorHandle_t t = nullptr;
  if (diopiRequireTensor(call->ctx, &t, &size, nullptr, from_legacy(dtype), diopi_device) != diopiSuccess) {
    return legacy::DIOPI_ERR_ALLOCATION;
  }
  *out = call->view(t);
  return legacy::DIOPI_SUCCESS;
}

}  // namespace

Call::Call(diopiContextHandle_t context) : ctx(context) {
  diopiStreamHandle_t stream = nullptr;
  diopiGetStream(ctx, &stream);
  lctx_.stream = stream;
  lctx_.allocator_state = this;
  lctx_.allocate = &allocate;
  lctx_.release = &release;
  lctx_.require_tensor = &require_tensor;
}

legacy::diopiTensor* Call::view(diopiConstTensorHandle_t t) {
  if (t == nullptr) return nullptr;
  legacy::diopiTensor& v = views_.add();
  const void* data = nullptr;
  diopiSize_t shape{}, stride{};
  diopiDtype_t dtype = diopi_dtype_unsupported;
  diopiDevice_t device = diopi_device;
  diopiGetTensorDataConst(t, &data);
  diopiGetTensorShape(t, &shape);
  diopiGetTensorStride(t, &stride);
  diopiGetTensorDtype(t, &dtype);
  diopiGetTensorDevice(t, &device);
  v.data = const_cast<void*>(data);
  v.ndim = shape.len;
  v.shape = shape.data;
  v.strides = stride.data;
  v.device = device == diopi_host ? legacy::DIOPI_DEVICE_HOST : legacy::DIOPI_DEVICE_DEVICE;
  if (!to_legacy(dtype, &v.dtype)) status_ = diopiDtypeNotSupported;
  return &v;
}

legacy::diopiTensorList_t Call::list(const diopiConstTensorHandle_t* tensors, int64_t count) {
  std::vector<legacy::diopiConstTensorHandle_t>& out = lists_.emplace_front();
  for (int64_t i = 0; i < count; ++i) out.push_back(view(tensors[i]));
  return legacy::diopiTensorList_t{out.data(), count};
}

legacy::diopiTensor* Call::scalar_like(const diopiScalar_t* s, diopiConstTensorHandle_t like) {
  diopiDtype_t dtype = diopi_dtype_float64;
  if (like != nullptr) diopiGetTensorDtype(like, &dtype);
  legacy::diopiTensor& v = views_.add();
  double& slot = scalar_storage_.add();  // 8 bytes: room for any dtype below
  const double x = value(s, 0.0);
  switch (dtype) {
    case diopi_dtype_float64: slot = x; break;
    case diopi_dtype_float32: { const float f = static_cast<float>(x); std::memcpy(&slot, &f, sizeof f); break; }
    case diopi_dtype_int64: { const int64_t i = static_cast<int64_t>(x); std::memcpy(&slot, &i, sizeof i); break; }
    case diopi_dtype_int32: { const int32_t i = static_cast<int32_t>(x); std::memcpy(&slot, &i, sizeof i); break; }
    case diopi_dtype_bfloat16: {
      const uint16_t b = diopi_ref::float_to_bf16(static_cast<float>(x));
      std::memcpy(&slot, &b, sizeof b);
      break;
    }
    default: status_ = diopiDtypeNotSupported; break;
  }
  v.data = &slot;
  v.ndim = 0;
  v.shape = nullptr;
  v.strides = nullptr;
  v.device = legacy::DIOPI_DEVICE_HOST;
  if (!to_legacy(dtype, &v.dtype)) status_ = diopiDtypeNotSupported;
  return &v;
}

bool Call::keepdim(diopiConstTensorHandle_t out, diopiConstTensorHandle_t input) {
  diopiSize_t a{}, b{};
  diopiGetTensorShape(out, &a);
  diopiGetTensorShape(input, &b);
  return a.len == b.len && b.len > 0;
}

diopiError_t Call::finish(legacy::diopiError_t code) const {
  switch (code) {
    case legacy::DIOPI_SUCCESS: return diopiSuccess;
    case legacy::DIOPI_ERR_NOT_IMPLEMENTED: return diopiNoImplement;
    case legacy::DIOPI_ERR_DTYPE: return diopiDtypeNotSupported;
    default: return diopiErrorOccurred;
  }
}

double value(const diopiScalar_t* s, double absent) {
  if (s == nullptr) return absent;
  switch (s->stype) {
    case diopi_dtype_float16: case diopi_dtype_float32: case diopi_dtype_float64: case diopi_dtype_bfloat16:
      return s->fval;
    default:
      return static_cast<double>(s->ival);
  }
}

bool index_shape(diopiConstTensorHandle_t input, const diopiConstTensorHandle_t* indices, int64_t count,
                 std::vector<int64_t>& shape) {
  diopiSize_t in{};
  diopiGetTensorShape(input, &in);
  std::vector<int64_t> broadcast;
  int64_t first = -1, last = -1;
  bool adjacent = true;
  for (int64_t k = 0; k < count; ++k) {
    if (indices[k] == nullptr) continue;
    diopiDtype_t dtype;
    diopiGetTensorDtype(indices[k], &dtype);
    if (dtype != diopi_dtype_int64 && dtype != diopi_dtype_int32) return false;
    if (first >= 0 && last != k - 1) adjacent = false;
    if (first < 0) first = k;
    last = k;
    diopiSize_t s{};
    diopiGetTensorShape(indices[k], &s);
    std::vector<int64_t> next(std::max<size_t>(broadcast.size(), static_cast<size_t>(s.len)), 1);
    for (size_t i = 0; i < next.size(); ++i) {
      const int64_t a = i < broadcast.size() ? broadcast[broadcast.size() - 1 - i] : 1;
      const int64_t b = static_cast<int64_t>(i) < s.len ? s.data[s.len - 1 - i] : 1;
      if (a != b && a != 1 && b != 1) return false;
      next[next.size() - 1 - i] = a == 1 ? b : a;
    }
    broadcast = next;
  }
  shape.clear();
  if (first < 0) {
    shape.assign(in.data, in.data + in.len);
    return true;
  }
  if (adjacent) {
    shape.assign(in.data, in.data + first);
    shape.insert(shape.end(), broadcast.begin(), broadcast.end());
    shape.insert(shape.end(), in.data + last + 1, in.data + in.len);
  } else {
    shape = broadcast;
    for (int64_t d = 0; d < in.len; ++d) {
      if (d >= count || indices[d] == nullptr) shape.push_back(in.data[d]);
    }
  }
  return true;
}

}  // namespace bridge

extern "C" {
const char* diopiGetVersion() { return "DIOPI Version: 1.0.0"; }
const char* diopiGetVendorName() { return "reference"; }
const char* diopiGetImplVersion() { return "diopi_bindings reference (CPU, the project's kernels)"; }
const char* diopiGetLastErrorString() { return legacy::diopi_last_error(); }
}

// diopiIndex allocates its result (its shape depends on the indices), so it is written here, not generated.
extern "C" diopiError_t diopiIndex(diopiContextHandle_t ctx, diopiTensorHandle_t* out, diopiConstTensorHandle_t input,
                                   diopiConstTensorHandle_t* indices, int64_t nums) {
  std::vector<int64_t> shape;
  if (!bridge::index_shape(input, indices, nums, shape)) return diopiNoImplement;
  diopiDtype_t dtype;
  diopiGetTensorDtype(input, &dtype);
  const diopiSize_t size{shape.data(), static_cast<int64_t>(shape.size())};
  if (diopiRequireTensor(ctx, out, &size, nullptr, dtype, diopi_device) != diopiSuccess) return diopiErrorOccurred;
  bridge::Call c(ctx);
  auto* result = c.view(*out);
  auto* self = c.view(input);
  const auto list = c.list(indices, nums);
  if (c.status() != diopiSuccess) return c.status();
  return c.finish(legacy::diopi_aten_index_Tensor(c.context(), result, self, list));
}

namespace {

// One element of a strided tensor as a double (the dtypes a comparison reads).
bool read(const char* base, diopiDtype_t dtype, int64_t offset, double* value) {
  switch (dtype) {
    case diopi_dtype_float64: *value = reinterpret_cast<const double*>(base)[offset]; return true;
    case diopi_dtype_float32: *value = reinterpret_cast<const float*>(base)[offset]; return true;
    case diopi_dtype_int64: *value = static_cast<double>(reinterpret_cast<const int64_t*>(base)[offset]); return true;
    case diopi_dtype_int32: *value = reinterpret_cast<const int32_t*>(base)[offset]; return true;
    case diopi_dtype_bool: *value = reinterpret_cast<const bool*>(base)[offset] ? 1.0 : 0.0; return true;
    case diopi_dtype_bfloat16: *value = diopi_ref::bf16_to_float(reinterpret_cast<const uint16_t*>(base)[offset]); return true;
    default: return false;
  }
}

struct Strided {
  const char* data = nullptr;
  diopiSize_t shape{}, stride{};
  diopiDtype_t dtype = diopi_dtype_unsupported;
  explicit Strided(diopiConstTensorHandle_t t) {
    const void* p = nullptr;
    diopiGetTensorDataConst(t, &p);
    data = static_cast<const char*>(p);
    diopiGetTensorShape(t, &shape);
    diopiGetTensorStride(t, &stride);
    diopiGetTensorDtype(t, &dtype);
  }
  // The element at `index` of a broadcast shape of rank `rank` (this shape aligned to its right).
  int64_t offset(const std::vector<int64_t>& index) const {
    int64_t off = 0;
    const size_t skip = index.size() - static_cast<size_t>(shape.len);
    for (int64_t d = 0; d < shape.len; ++d) off += (shape.data[d] == 1 ? 0 : index[skip + d]) * stride.data[d];
    return off;
  }
};

}  // namespace

// The reference has no le kernel of its own: out (bool) = input <= other, broadcast, NaN false.
extern "C" diopiError_t diopiLe(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                                diopiConstTensorHandle_t other) {
  const Strided a(input), b(other), o(out);
  if (o.dtype != diopi_dtype_bool) return diopiDtypeNotSupported;
  void* raw = nullptr;
  diopiGetTensorData(out, &raw);
  bool* dst = static_cast<bool*>(raw);
  int64_t numel = 0;
  diopiGetTensorNumel(out, &numel);
  std::vector<int64_t> index(static_cast<size_t>(o.shape.len), 0);
  for (int64_t n = 0; n < numel; ++n) {
    double x, y;
    if (!read(a.data, a.dtype, a.offset(index), &x) || !read(b.data, b.dtype, b.offset(index), &y)) {
      return diopiDtypeNotSupported;
    }
    dst[o.offset(index)] = x <= y;
    for (int64_t d = o.shape.len - 1; d >= 0; --d) {
      if (++index[d] < o.shape.data[d]) break;
      index[d] = 0;
    }
  }
  return diopiSuccess;
}
