#include "tensor_io.h"
#include "float_bits.h"

#include <cmath>
#include <cstring>

namespace diopi_ref {
namespace {

thread_local std::string last_error;

double load(const void* data, diopiDtype_t dtype, int64_t i) {
  switch (dtype) {
    case DIOPI_DTYPE_BOOL: return static_cast<const bool*>(data)[i] ? 1.0 : 0.0;
    case DIOPI_DTYPE_INT32: return static_cast<const int32_t*>(data)[i];
    case DIOPI_DTYPE_INT64: return double(static_cast<const int64_t*>(data)[i]);
    case DIOPI_DTYPE_FLOAT16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
    case DIOPI_DTYPE_BFLOAT16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DIOPI_DTYPE_FLOAT32: return static_cast<const float*>(data)[i];
    case DIOPI_DTYPE_FLOAT64: return static_cast<const double*>(data)[i];
  }
  fail(DIOPI_ERR_DTYPE, "unknown dtype code " + std::to_string(int(dtype)));
}

void store(void* data, diopiDtype_t dtype, int64_t i, double v) {
  switch (dtype) {
    case DIOPI_DTYPE_BOOL: static_cast<bool*>(data)[i] = v != 0.0; return;
    case DIOPI_DTYPE_INT32: static_cast<int32_t*>(data)[i] = int32_t(v); return;
    case DIOPI_DTYPE_INT64: static_cast<int64_t*>(data)[i] = int64_t(v); return;
    case DIOPI_DTYPE_FLOAT16: static_cast<uint16_t*>(data)[i] = float_to_half(float(v)); return;
    case DIOPI_DTYPE_BFLOAT16: static_cast<uint16_t*>(data)[i] = float_to_bf16(float(v)); return;
    case DIOPI_DTYPE_FLOAT32: static_cast<float*>(data)[i] = float(v); return;
    case DIOPI_DTYPE_FLOAT64: static_cast<double*>(data)[i] = v; return;
  }
  fail(DIOPI_ERR_DTYPE, "unknown dtype code " + std::to_string(int(dtype)));
}

bool is_float(diopiDtype_t d) {
  return d == DIOPI_DTYPE_FLOAT16 || d == DIOPI_DTYPE_BFLOAT16 || d == DIOPI_DTYPE_FLOAT32 ||
         d == DIOPI_DTYPE_FLOAT64;
}

// Calls fn(linear, offset) for every element of `shape` in row-major order, offset through strides.
template <class Fn>
void for_each(const Shape& shape, const Shape& strides, Fn&& fn) {
  const int64_t n = numel(shape);
  if (n == 0) return;
  const size_t nd = shape.size();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (int64_t lin = 0; lin < n; ++lin) {
    fn(lin, off);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

Shape strides_of(diopiConstTensorHandle_t t) { return Shape(t->strides, t->strides + t->ndim); }

// Whether elements lie in row-major order with no gaps: linear index == memory offset.
bool row_major(const Shape& shape, const Shape& strides) {
  int64_t expected = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

// The common case of a dense float32/float64 tensor: one dtype decision per tensor, not per element.
// Returns false where the element-wise path must run.
bool read_dense(diopiConstTensorHandle_t t, Buffer& out) {
  const int64_t n = int64_t(out.size());
  if (t->dtype == DIOPI_DTYPE_FLOAT32) {
    const float* p = static_cast<const float*>(t->data);
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = p[i];
    return true;
  }
  if (t->dtype == DIOPI_DTYPE_FLOAT64) {
    if (n > 0) std::memcpy(out.data(), t->data, size_t(n) * sizeof(double));
    return true;
  }
  return false;
}

bool write_dense(diopiTensorHandle_t t, const Buffer& values) {
  const int64_t n = int64_t(values.size());
  if (t->dtype == DIOPI_DTYPE_FLOAT32) {
    float* p = static_cast<float*>(t->data);
    for (int64_t i = 0; i < n; ++i) p[i] = float(values[size_t(i)]);
    return true;
  }
  if (t->dtype == DIOPI_DTYPE_FLOAT64) {
    if (n > 0) std::memcpy(t->data, values.data(), size_t(n) * sizeof(double));
    return true;
  }
  return false;
}

}  // namespace

void fail(diopiError_t code, const std::string& message) { throw Failure{code, message}; }
void set_last_error(const std::string& message) { last_error = message; }

const char*& current_kernel() {
  thread_local const char* symbol = nullptr;
  return symbol;
}

const char* last_error_message() { return last_error.c_str(); }

Shape shape_of(diopiConstTensorHandle_t t) { return Shape(t->shape, t->shape + t->ndim); }

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const int64_t y = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (x != y && x != 1 && y != 1)
      fail(DIOPI_ERR_INVALID_ARGUMENT, "shapes " + to_string(a) + " and " + to_string(b) + " do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

int64_t normalize_dim(int64_t dim, int64_t ndim) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  if (dim < -n || dim >= n)
    fail(DIOPI_ERR_INVALID_ARGUMENT, "dim " + std::to_string(dim) + " out of range for " + std::to_string(ndim) + " dims");
  return dim < 0 ? dim + n : dim;
}

diopiConstTensorHandle_t need(diopiConstTensorHandle_t t, const char* name) {
  if (t == nullptr) fail(DIOPI_ERR_INVALID_ARGUMENT, std::string(name) + " is NULL");
  return t;
}

void require_float(std::initializer_list<diopiConstTensorHandle_t> tensors) {
  for (auto t : tensors)
    if (t != nullptr && !is_float(t->dtype))
      fail(DIOPI_ERR_DTYPE, "dtype code " + std::to_string(int(t->dtype)) + " where a floating dtype is expected");
}

void require_index(diopiConstTensorHandle_t t, const char* name) {
  if (t->dtype != DIOPI_DTYPE_INT64 && t->dtype != DIOPI_DTYPE_INT32)
    fail(DIOPI_ERR_DTYPE, std::string(name) + " must be int64 or int32");
}

void require_shape(diopiConstTensorHandle_t t, const Shape& shape, const char* name) {
  if (shape_of(t) != shape)
    fail(DIOPI_ERR_INVALID_ARGUMENT,
         std::string(name) + " has shape " + to_string(shape_of(t)) + ", expected " + to_string(shape));
}

Buffer read(diopiConstTensorHandle_t t) { return read(t, shape_of(t)); }

Buffer read(diopiConstTensorHandle_t t, const Shape& as_shape) {
  const Shape own = shape_of(t), own_strides = strides_of(t);
  if (as_shape.size() < own.size())
    fail(DIOPI_ERR_INVALID_ARGUMENT, "cannot broadcast " + to_string(own) + " to " + to_string(as_shape));
  Shape strides(as_shape.size(), 0);
  const size_t lead = as_shape.size() - own.size();
  for (size_t i = 0; i < own.size(); ++i) {
    if (own[i] == as_shape[lead + i]) {
      strides[lead + i] = own_strides[i];
    } else if (own[i] != 1) {
      fail(DIOPI_ERR_INVALID_ARGUMENT, "cannot broadcast " + to_string(own) + " to " + to_string(as_shape));
    }
  }
  Buffer out(size_t(numel(as_shape)));
  if (row_major(as_shape, strides) && read_dense(t, out)) return out;
  for_each(as_shape, strides, [&](int64_t lin, int64_t off) { out[lin] = load(t->data, t->dtype, off); });
  return out;
}

std::vector<int64_t> read_index(diopiConstTensorHandle_t t) {
  std::vector<int64_t> out(size_t(numel(shape_of(t))));
  for_each(shape_of(t), strides_of(t), [&](int64_t lin, int64_t off) {
    out[lin] = t->dtype == DIOPI_DTYPE_INT64 ? static_cast<const int64_t*>(t->data)[off]
                                              : static_cast<const int32_t*>(t->data)[off];
  });
  return out;
}

void write_output(diopiTensorHandle_t t, const Buffer& values, const char* symbol) {
  const Shape shape = shape_of(t);
  if (int64_t(values.size()) != numel(shape))
    fail(DIOPI_ERR_INVALID_ARGUMENT, "output has shape " + to_string(shape) + " (" + std::to_string(numel(shape)) +
                                         " elements) but the result has " + std::to_string(values.size()));
  // A test build: the planted kernels' results are off by 1% (relative; integers by one), the rest exact.
  const bool wrong = planted_wrong(symbol);
  if (!wrong && row_major(shape, strides_of(t)) && write_dense(t, values)) return;
  for_each(shape, strides_of(t), [&](int64_t lin, int64_t off) {
    // Integer results are off by one: 1% of a small index rounds back to the index itself.
    const double planted = is_float(t->dtype) ? values[lin] * 1.01 + 1e-3 : values[lin] + 1.0;
    store(t->data, t->dtype, off, wrong ? planted : values[lin]);
  });
}

Reduction reduction(const Shape& shape, const std::vector<int64_t>& dims, bool with_slots) {
  std::vector<bool> reduced(shape.size(), dims.empty());
  for (int64_t d : dims) reduced[normalize_dim(d, int64_t(shape.size()))] = true;
  Reduction r;
  Shape out_strides(shape.size(), 0);
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (!reduced[i]) {
      out_strides[i] = stride;
      stride *= shape[i];
    } else {
      r.group_size *= shape[i];
    }
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    r.out_shape.push_back(reduced[i] ? 1 : shape[i]);
    if (!reduced[i]) r.out_shape_squeezed.push_back(shape[i]);
  }
  r.slot_strides = out_strides;
  if (!with_slots) return r;
  r.slot.resize(size_t(numel(shape)));
  for_each(shape, out_strides, [&](int64_t lin, int64_t off) { r.slot[lin] = off; });
  return r;
}

Split split_at(const Shape& shape, int64_t dim) {
  Split s{1, 1, 1};
  for (int64_t i = 0; i < int64_t(shape.size()); ++i) {
    if (i < dim) s.outer *= shape[i];
    else if (i == dim) s.length = shape[i];
    else s.inner *= shape[i];
  }
  return s;
}

}  // namespace diopi_ref
