// A small operator library as a vendor writes it against DIOPI (DeepLink's <diopi/functions.h>): it reads
// tensors only through the runtime's accessors, asks the framework for scratch memory, and computes in double
// over any strides. No diopi_bindings header beyond DIOPI's own. float64 sums are declined (diopiNoImplement)
// so the framework's CPU path is exercised, and diopiSub always fails (diopiErrorOccurred, with a message) so the
// framework's error path is. VENDOR_VERSION overrides the version it reports. It computes float32 and float64
// and declines other dtypes (diopiDtypeNotSupported). Two faults can be planted for the conformance suite:
// PLANT_SOFTMAX_LONG_ROWS (softmax 0.1% too large on rows longer than 1,000) and PLANT_RELU_SEGFAULT (relu
// dereferences NULL on a 0-dim input).
#include <diopi/functions.h>

#include <cmath>
#include <cstring>
#include <vector>

#ifndef VENDOR_VERSION
#define VENDOR_VERSION "DIOPI Version: 1.0.0"
#endif

namespace {

struct View {
  char* data = nullptr;
  std::vector<int64_t> shape, stride;
  diopiDtype_t dtype = diopi_dtype_unsupported;
  int64_t numel = 0;

  explicit View(diopiConstTensorHandle_t t) {
    const void* p = nullptr;
    diopiGetTensorDataConst(t, &p);
    data = static_cast<char*>(const_cast<void*>(p));
    diopiSize_t s, st;
    diopiGetTensorShape(t, &s);
    diopiGetTensorStride(t, &st);
    shape.assign(s.data, s.data + s.len);
    stride.assign(st.data, st.data + st.len);
    diopiGetTensorDtype(t, &dtype);
    diopiGetTensorNumel(t, &numel);
  }
  // Element at a multi-index of `full` (a broadcast shape this view's shape aligns to from the right).
  int64_t offset(const std::vector<int64_t>& index) const {
    int64_t off = 0;
    const size_t skip = index.size() - shape.size();
    for (size_t d = 0; d < shape.size(); ++d) off += (shape[d] == 1 ? 0 : index[skip + d]) * stride[d];
    return off;
  }
  double get(const std::vector<int64_t>& index) const {
    const int64_t o = offset(index);
    return dtype == diopi_dtype_float64 ? reinterpret_cast<double*>(data)[o] : reinterpret_cast<float*>(data)[o];
  }
  void set(const std::vector<int64_t>& index, double v) const {
    const int64_t o = offset(index);
    if (dtype == diopi_dtype_float64) reinterpret_cast<double*>(data)[o] = v;
    else reinterpret_cast<float*>(data)[o] = static_cast<float>(v);
  }
  bool floating() const { return dtype == diopi_dtype_float32 || dtype == diopi_dtype_float64; }
};

bool all_floating(std::initializer_list<diopiConstTensorHandle_t> tensors) {
  for (auto t : tensors)
    if (t != nullptr && !View(t).floating()) return false;
  return true;
}

bool next(std::vector<int64_t>& index, const std::vector<int64_t>& shape) {
  for (size_t d = shape.size(); d-- > 0;) {
    if (++index[d] < shape[d]) return true;
    index[d] = 0;
  }
  return false;
}

double value(const diopiScalar_t* s) {
  if (s == nullptr) return 1.0;
  return s->stype == diopi_dtype_float64 || s->stype == diopi_dtype_float32 ? s->fval : static_cast<double>(s->ival);
}

// out[i] = f(inputs at i), broadcasting every input to out's shape.
template <class F>
diopiError_t elementwise(diopiTensorHandle_t out, std::vector<diopiConstTensorHandle_t> inputs, F f) {
  View o(out);
  std::vector<View> in;
  for (auto t : inputs) in.emplace_back(t);
  if (!o.floating()) return diopiDtypeNotSupported;
  for (const View& v : in) if (!v.floating()) return diopiDtypeNotSupported;
  if (o.numel == 0) return diopiSuccess;
  std::vector<int64_t> index(o.shape.size(), 0);
  std::vector<double> x(in.size());
  do {
    for (size_t k = 0; k < in.size(); ++k) x[k] = in[k].get(index);
    o.set(index, f(x));
  } while (next(index, o.shape));
  return diopiSuccess;
}

// out = beta * bias + alpha * (a @ b); the product is accumulated in framework scratch memory.
diopiError_t matmul(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t bias,
                    diopiConstTensorHandle_t a, diopiConstTensorHandle_t b, double beta, double alpha) {
  if (!all_floating({out, bias, a, b})) return diopiDtypeNotSupported;
  View o(out), x(a), y(b);
  const size_t batched = o.shape.size() == 3;
  const int64_t B = batched ? o.shape[0] : 1, M = o.shape[batched], N = o.shape[batched + 1], K = x.shape[batched + 1];
  diopiTensorHandle_t scratch = nullptr;
  if (diopiRequireBuffer(ctx, &scratch, M * N * static_cast<int64_t>(sizeof(double)), diopi_device) != diopiSuccess) {
    return diopiErrorOccurred;
  }
  void* raw = nullptr;
  diopiGetTensorData(scratch, &raw);
  double* acc = static_cast<double*>(raw);
  for (int64_t bi = 0; bi < B; ++bi) {
    std::memset(acc, 0, sizeof(double) * M * N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) {
        const double xv = batched ? x.get({bi, i, k}) : x.get({i, k});
        for (int64_t j = 0; j < N; ++j) acc[i * N + j] += xv * (batched ? y.get({bi, k, j}) : y.get({k, j}));
      }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double v = alpha * acc[i * N + j];
        if (bias != nullptr) v += beta * View(bias).get({i, j});
        if (batched) o.set({bi, i, j}, v); else o.set({i, j}, v);
      }
  }
  return diopiSuccess;
}

// Softmax and its backward along `dim` of a contiguous-or-strided tensor, one row at a time.
template <class F>
diopiError_t rows(diopiTensorHandle_t out, int64_t dim, std::vector<diopiConstTensorHandle_t> inputs, F f) {
  View o(out);
  std::vector<View> in;
  for (auto t : inputs) in.emplace_back(t);
  if (!o.floating()) return diopiDtypeNotSupported;
  for (const View& v : in) if (!v.floating()) return diopiDtypeNotSupported;
  if (o.numel == 0) return diopiSuccess;
  const int64_t nd = static_cast<int64_t>(o.shape.size());
  if (dim < 0) dim += nd;
  std::vector<int64_t> outer = o.shape;
  const int64_t len = o.shape[dim];
  outer[dim] = 1;
  std::vector<int64_t> index(nd, 0);
  std::vector<std::vector<double>> x(in.size(), std::vector<double>(len));
  std::vector<double> y(len);
  do {
    for (size_t k = 0; k < in.size(); ++k)
      for (int64_t i = 0; i < len; ++i) { index[dim] = i; x[k][i] = in[k].get(index); }
    f(x, y);
    for (int64_t i = 0; i < len; ++i) { index[dim] = i; o.set(index, y[i]); }
    index[dim] = 0;
  } while (next(index, outer));
  return diopiSuccess;
}

}  // namespace

extern "C" {

const char* diopiGetVersion() { return VENDOR_VERSION; }
const char* diopiGetVendorName() { return "test-vendor"; }
const char* diopiGetImplVersion() { return "0.1"; }
const char* diopiGetLastErrorString() { return "test-vendor: sub is broken on purpose"; }

diopiError_t diopiSub(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other, const diopiScalar_t* alpha) {
  return diopiErrorOccurred;
}

diopiError_t diopiAdd(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other, const diopiScalar_t* alpha) {
  diopiStreamHandle_t stream = reinterpret_cast<diopiStreamHandle_t>(1);
  if (diopiGetStream(ctx, &stream) != diopiSuccess) return diopiErrorOccurred;
  const double a = value(alpha);
  return elementwise(out, {input, other}, [a](const std::vector<double>& x) { return x[0] + a * x[1]; });
}

diopiError_t diopiAddInp(diopiContextHandle_t ctx, diopiTensorHandle_t input, diopiConstTensorHandle_t other,
                         const diopiScalar_t* alpha) {
  return diopiAdd(ctx, input, input, other, alpha);
}

diopiError_t diopiMul(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other) {
  return elementwise(out, {input, other}, [](const std::vector<double>& x) { return x[0] * x[1]; });
}

diopiError_t diopiMulScalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                            const diopiScalar_t* other) {
  const double s = value(other);
  return elementwise(out, {input}, [s](const std::vector<double>& x) { return x[0] * s; });
}

diopiError_t diopiMm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                     diopiConstTensorHandle_t mat2) {
  return matmul(ctx, out, nullptr, input, mat2, 0.0, 1.0);
}

diopiError_t diopiBmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t mat2) {
  return matmul(ctx, out, nullptr, input, mat2, 0.0, 1.0);
}

diopiError_t diopiAddmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                        diopiConstTensorHandle_t mat1, diopiConstTensorHandle_t mat2, const diopiScalar_t* beta,
                        const diopiScalar_t* alpha) {
  // a 1-d bias broadcasts over the rows: View aligns shapes from the right
  return matmul(ctx, out, input, mat1, mat2, value(beta), value(alpha));
}

diopiError_t diopiRelu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
#ifdef PLANT_RELU_SEGFAULT
  if (View(input).shape.empty()) *static_cast<volatile int*>(nullptr) = 1;
#endif
  return elementwise(out, {input}, [](const std::vector<double>& x) { return x[0] > 0 ? x[0] : 0.0; });
}

diopiError_t diopiThresholdBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    const diopiScalar_t* threshold) {
  const double t = value(threshold);
  return elementwise(grad_input, {grad_output, input},
                     [t](const std::vector<double>& x) { return x[1] <= t ? 0.0 : x[0]; });
}

// DIOPI's clamp takes a NULL min or max for an absent bound (torch.clamp(x, min=0)).
diopiError_t diopiClampScalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                              const diopiScalar_t* min, const diopiScalar_t* max) {
  const double lo = min != nullptr ? value(min) : -INFINITY, hi = max != nullptr ? value(max) : INFINITY;
  return elementwise(out, {input}, [lo, hi](const std::vector<double>& x) {
    return std::isnan(x[0]) ? x[0] : std::min(std::max(x[0], lo), hi);
  });
}

diopiError_t diopiSilu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return elementwise(out, {input}, [](const std::vector<double>& x) { return x[0] / (1.0 + std::exp(-x[0])); });
}

diopiError_t diopiSiluBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input) {
  return elementwise(grad_input, {grad_output, input}, [](const std::vector<double>& x) {
    const double s = 1.0 / (1.0 + std::exp(-x[1]));
    return x[0] * s * (1.0 + x[1] * (1.0 - s));
  });
}

diopiError_t diopiSoftmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          int64_t dim) {
  return rows(out, dim, {input}, [](const std::vector<std::vector<double>>& x, std::vector<double>& y) {
    double top = x[0][0], sum = 0;
    for (double v : x[0]) top = std::max(top, v);
    for (size_t i = 0; i < y.size(); ++i) sum += (y[i] = std::exp(x[0][i] - top));
    for (double& v : y) v /= sum;
#ifdef PLANT_SOFTMAX_LONG_ROWS
    if (y.size() > 1000)
      for (double& v : y) v *= 1.001;
#endif
  });
}

diopiError_t diopiSoftmaxBackward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output, int64_t dim) {
  return rows(grad_input, dim, {grad_output, output},
              [](const std::vector<std::vector<double>>& x, std::vector<double>& y) {
                double dot = 0;
                for (size_t i = 0; i < y.size(); ++i) dot += x[0][i] * x[1][i];
                for (size_t i = 0; i < y.size(); ++i) y[i] = x[1][i] * (x[0][i] - dot);
              });
}

diopiError_t diopiSum(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiSize_t dim) {
  View in(input), o(out);
  if (in.dtype == diopi_dtype_float64) return diopiNoImplement;  // the framework's CPU path serves it
  if (!in.floating() || !o.floating()) return diopiDtypeNotSupported;
  std::vector<bool> reduced(in.shape.size(), dim.len == 0);
  for (int64_t k = 0; k < dim.len; ++k) {
    int64_t d = dim.data[k];
    reduced[d < 0 ? d + static_cast<int64_t>(in.shape.size()) : d] = true;
  }
  std::vector<double> acc(static_cast<size_t>(o.numel), 0.0);
  std::vector<int64_t> index(in.shape.size(), 0);
  if (in.numel > 0) {
    do {
      int64_t flat = 0;  // the output element: the kept dimensions, in order
      for (size_t d = 0; d < in.shape.size(); ++d)
        if (!reduced[d]) flat = flat * in.shape[d] + index[d];
      acc[flat] += in.get(index);
    } while (next(index, in.shape));
  }
  // out is contiguous with the kept dimensions (and size-1 reduced ones when keepdim): write in order.
  std::vector<int64_t> oi(o.shape.size(), 0);
  size_t k = 0;
  if (o.numel > 0) {
    do { o.set(oi, acc[k++]); } while (next(oi, o.shape));
  }
  return diopiSuccess;
}

}  // extern "C"
