// The operators of the asynchronous test vendor, against DeepLink's DIOPI (<diopi/functions.h>): each reads
// its handles, asks diopiGetStream for the call's stream and queues the computation there (run later by the
// stream's worker thread, runtime.cpp); it returns before the result exists. float32, contiguous tensors
// only; anything else is declined (diopiNoImplement: the framework's CPU path). mm accumulates in scratch
// from diopiRequireBuffer, which must be device memory of this vendor.
#include <diopi/functions.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "stream_queue.h"

namespace {

std::atomic<int64_t> g_scratch_on_device{0}, g_scratch_elsewhere{0};
thread_local const char* t_error = "";

struct Flat {
  float* data = nullptr;
  int64_t numel = 0;
  std::vector<int64_t> shape;
  bool ok = false;
};

Flat flat(diopiConstTensorHandle_t t) {
  Flat f;
  diopiDtype_t dtype;
  diopiSize_t shape, stride;
  const void* p = nullptr;
  if (diopiGetTensorDtype(t, &dtype) != diopiSuccess || dtype != diopi_dtype_float32) return f;
  diopiGetTensorShape(t, &shape);
  diopiGetTensorStride(t, &stride);
  int64_t expected = 1;
  for (int64_t d = shape.len; d-- > 0;) {
    if (shape.data[d] != 1 && stride.data[d] != expected) return f;
    expected *= shape.data[d];
  }
  diopiGetTensorDataConst(t, &p);
  diopiGetTensorNumel(t, &f.numel);
  f.data = static_cast<float*>(const_cast<void*>(p));
  f.shape.assign(shape.data, shape.data + shape.len);
  f.ok = true;
  return f;
}

void* stream_of(diopiContextHandle_t ctx) {
  diopiStreamHandle_t stream = nullptr;
  diopiGetStream(ctx, &stream);
  return stream;
}

double number(const diopiScalar_t* s) {
  return s->stype == diopi_dtype_float64 ? s->fval : static_cast<double>(s->ival);
}

// out = f(a[i], b[i]) with equal shapes, queued on the call's stream.
template <class F>
diopiError_t binary(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t a,
                    diopiConstTensorHandle_t b, F f) {
  const Flat o = flat(out), x = flat(a), y = flat(b);
  if (!o.ok || !x.ok || !y.ok || x.numel != o.numel || y.numel != o.numel) return diopiNoImplement;
  void* stream = stream_of(ctx);
  if (stream == nullptr) {
    t_error = "async-test-vendor: diopiGetStream gave no stream";
    return diopiErrorOccurred;
  }
  asyncvendor::enqueue(stream, [=] {
    for (int64_t i = 0; i < o.numel; ++i) o.data[i] = f(x.data[i], y.data[i]);
  });
  return diopiSuccess;
}

}  // namespace

extern "C" {

const char* diopiGetVersion() { return "DIOPI Version: 1.0.0"; }
const char* diopiGetVendorName() { return "async-test-vendor"; }
const char* diopiGetLastErrorString() { return t_error; }

diopiError_t diopiAdd(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other, const diopiScalar_t* alpha) {
  const float k = static_cast<float>(number(alpha));
  return binary(ctx, out, input, other, [k](float a, float b) { return a + k * b; });
}

diopiError_t diopiMul(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t other) {
  return binary(ctx, out, input, other, [](float a, float b) { return a * b; });
}

diopiError_t diopiMm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                     diopiConstTensorHandle_t mat2) {
  const Flat o = flat(out), x = flat(input), y = flat(mat2);
  if (!o.ok || !x.ok || !y.ok) return diopiNoImplement;
  const int64_t M = x.shape[0], K = x.shape[1], N = y.shape[1];
  diopiTensorHandle_t scratch = nullptr;
  if (diopiRequireBuffer(ctx, &scratch, M * N * static_cast<int64_t>(sizeof(double)), diopi_device) != diopiSuccess)
    return diopiErrorOccurred;
  void* raw = nullptr;
  diopiGetTensorData(scratch, &raw);
  (asyncvendor::is_device_memory(raw, M * N * static_cast<int64_t>(sizeof(double))) ? g_scratch_on_device
                                                                                     : g_scratch_elsewhere)++;
  auto* acc = static_cast<double*>(raw);
  void* stream = stream_of(ctx);
  if (stream == nullptr) return diopiErrorOccurred;
  asyncvendor::enqueue(stream, [=] {
    std::memset(acc, 0, sizeof(double) * M * N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) acc[i * N + j] += double(x.data[i * K + k]) * y.data[k * N + j];
    for (int64_t i = 0; i < M * N; ++i) o.data[i] = static_cast<float>(acc[i]);
  });
  return diopiSuccess;
}

int64_t asyncvendor_scratch_on_device(void) { return g_scratch_on_device.load(); }
int64_t asyncvendor_scratch_elsewhere(void) { return g_scratch_elsewhere.load(); }

}  // extern "C"
