// Elementwise arithmetic and activations with their backward kernels (torch broadcasting).
#include <cmath>

#include "dense_float.h"
#include "fast_exp.h"
#include "silu_math.h"
#include "strided.h"
#include "tensor_io.h"

using namespace diopi_ref;

namespace {

constexpr double kSqrt2 = 1.4142135623730951, kSqrt2OverPi = 0.7978845608028654, kGeluC = 0.044715;

// f computes in double: operands of one floating dtype go through the strided loop (strided.h), the rest
// through double buffers; both round each result once, so they give the same bits.
template <class F>
diopiError_t unary(const char* symbol, diopiTensorHandle_t out, diopiConstTensorHandle_t self, F f) {
  return guarded(symbol, [&] {
    need(out, "out"), need(self, "self");
    require_float({out, self});
    require_shape(out, shape_of(self), "out");
    if (elementwise_strided(symbol, out, shape_of(self), f, self)) return;
    Buffer x = read(self);
    with_typed(out->dtype, f, [&](auto g) {
      for (double& v : x) v = g(v);
    });
    write_output(out, x, symbol);
  });
}

// integers: add, sub and mul also take int32/int64 (index arithmetic), exact below 2^53 in double.
// run: the kernel's dense float32 loop (dense_ops.h) for the strided loop's runs; f's expression.
template <class F>
diopiError_t binary(const char* symbol, diopiTensorHandle_t out, diopiConstTensorHandle_t a,
                    diopiConstTensorHandle_t b, F f, bool integers = false, DenseRun run = {}) {
  return guarded(symbol, [&] {
    need(out, "out"), need(a, "first input"), need(b, "second input");
    if (!integers) require_float({out, a, b});
    const Shape shape = broadcast_shapes(shape_of(a), shape_of(b));
    require_shape(out, shape, "out");
    if (elementwise_strided_run(run, symbol, out, shape, f, a, b)) return;
    Buffer x = read(a, shape);
    const Buffer y = read(b, shape);
    with_typed(out->dtype, f, [&](auto g) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = g(x[i], y[i]);
    });
    write_output(out, x, symbol);
  });
}

// The dense float32 loop (dense_float.h) when out and the operands are dense float32 of out's shape; false
// (nothing written) otherwise, or for a test build's planted kernel.
bool dense(const char* symbol, DenseOp op, diopiTensorHandle_t out, diopiConstTensorHandle_t a,
           diopiConstTensorHandle_t b = nullptr, diopiConstTensorHandle_t c = nullptr, double s = 0.0) {
  if (out == nullptr || a == nullptr || (b == nullptr && op != DenseOp::kSqrt) ||
      (c == nullptr && (op == DenseOp::kAddcmul || op == DenseOp::kAddcdiv)))
    return false;
  const bool ok = c != nullptr ? dense_float32(out, {a, b, c}) : b != nullptr ? dense_float32(out, {a, b})
                                                                              : dense_float32(out, {a});
  if (!ok || planted_wrong(symbol)) return false;
  const auto data = [](diopiConstTensorHandle_t t) { return t ? static_cast<const float*>(t->data) : nullptr; };
  elementwise_float32(op, static_cast<float*>(out->data), data(a), data(b), data(c), numel(shape_of(out)), s);
  return true;
}

double gelu(double x, int64_t approximate) {
  if (approximate == 0) return 0.5 * x * (1.0 + std::erf(x / kSqrt2));
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x)));
}

double gelu_grad(double x, int64_t approximate) {
  if (approximate == 0) return 0.5 * (1.0 + std::erf(x / kSqrt2)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
  const double t = std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluC * x * x);
}

void check_approximate(int64_t approximate) {
  if (approximate != 0 && approximate != 1)
    fail(DIOPI_ERR_INVALID_ARGUMENT, "approximate must be 0 (none) or 1 (tanh), got " + std::to_string(approximate));
}

}  // namespace

extern "C" {

diopiError_t diopi_aten_add_Tensor(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                   diopiConstTensorHandle_t other, double alpha) {
  if (dense(__func__, DenseOp::kAdd, out, self, other, nullptr, alpha)) return DIOPI_SUCCESS;
  return binary(__func__, out, self, other, [alpha](double a, double b) { return a + alpha * b; }, true,
                DenseRun{true, DenseOp::kAdd, alpha});
}

diopiError_t diopi_aten_sub_Tensor(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                   diopiConstTensorHandle_t other, double alpha) {
  if (dense(__func__, DenseOp::kSub, out, self, other, nullptr, alpha)) return DIOPI_SUCCESS;
  return binary(__func__, out, self, other, [alpha](double a, double b) { return a - alpha * b; }, true,
                DenseRun{true, DenseOp::kSub, alpha});
}

diopiError_t diopi_aten_mul_Tensor(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                   diopiConstTensorHandle_t other) {
  if (dense(__func__, DenseOp::kMul, out, self, other)) return DIOPI_SUCCESS;
  return binary(__func__, out, self, other, [](double a, double b) { return a * b; }, true,
                DenseRun{true, DenseOp::kMul, 0.0});
}

diopiError_t diopi_aten_div_Tensor(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                   diopiConstTensorHandle_t other) {
  if (dense(__func__, DenseOp::kDiv, out, self, other)) return DIOPI_SUCCESS;
  return binary(__func__, out, self, other, [](double a, double b) { return a / b; }, false,
                DenseRun{true, DenseOp::kDiv, 0.0});
}

diopiError_t diopi_aten_neg(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self, [](double x) { return -x; });
}

diopiError_t diopi_aten_exp(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self,
               [](auto* tag, double x) { return exp_as<std::remove_pointer_t<decltype(tag)>>(x); });
}

diopiError_t diopi_aten_rsqrt(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self, [](double x) { return 1.0 / std::sqrt(x); });
}

diopiError_t diopi_aten_sigmoid(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self,
               [](auto* tag, double x) { return sigmoid_of<std::remove_pointer_t<decltype(tag)>>(x); });
}

diopiError_t diopi_aten_silu(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  if (out != nullptr && self != nullptr && dense_float32(out, {self}) && !planted_wrong(__func__)) {
    silu_float32(static_cast<const float*>(self->data), static_cast<float*>(out->data), numel(shape_of(out)));
    return DIOPI_SUCCESS;
  }
  return unary(__func__, out, self,
               [](auto* tag, double x) { return silu_of<std::remove_pointer_t<decltype(tag)>>(x); });
}

diopiError_t diopi_aten_gelu(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                             int64_t approximate) {
  if (diopiError_t err = guarded(__func__, [&] { check_approximate(approximate); })) return err;
  return unary(__func__, out, self, [approximate](double x) { return gelu(x, approximate); });
}

diopiError_t diopi_aten_pow_Tensor_Scalar(diopiContextHandle_t, diopiTensorHandle_t out,
                                          diopiConstTensorHandle_t self, double exponent) {
  // x * x: exact in double for float32/16 inputs (so equal to pow), torch's own kernel for exponent 2 (RMSNorm
  // squares every activation)
  if (exponent == 2.0) return unary(__func__, out, self, [](double x) { return x * x; });
  return unary(__func__, out, self, [exponent](double x) { return std::pow(x, exponent); });
}

diopiError_t diopi_aten_pow_Scalar(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t exponent,
                                   double self) {
  return unary(__func__, out, exponent, [self](double x) { return std::pow(self, x); });
}

diopiError_t diopi_aten_reciprocal(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self, [](double x) { return 1.0 / x; });
}

diopiError_t diopi_aten_sqrt(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  if (dense(__func__, DenseOp::kSqrt, out, self)) return DIOPI_SUCCESS;
  return unary(__func__, out, self, [](double x) { return std::sqrt(x); });
}

diopiError_t diopi_aten_log(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self, [](double x) { return std::log(x); });
}

diopiError_t diopi_aten_cos(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self, [](double x) { return std::cos(x); });
}

diopiError_t diopi_aten_sin(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self, [](double x) { return std::sin(x); });
}

diopiError_t diopi_aten_addcmul(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2, double value) {
  if (dense(__func__, DenseOp::kAddcmul, out, self, tensor1, tensor2, value)) return DIOPI_SUCCESS;
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self"), need(tensor1, "tensor1"), need(tensor2, "tensor2");
    require_float({out, self, tensor1, tensor2});
    const Shape shape = broadcast_shapes(broadcast_shapes(shape_of(self), shape_of(tensor1)), shape_of(tensor2));
    require_shape(out, shape, "out");
    const auto f = [value](double x, double a, double b) { return x + value * a * b; };
    if (elementwise_strided(kernel_name(__func__), out, shape, f, self, tensor1, tensor2)) return;
    Buffer x = read(self, shape);
    const Buffer a = read(tensor1, shape), b = read(tensor2, shape);
    for (size_t i = 0; i < x.size(); ++i) x[i] = f(x[i], a[i], b[i]);
    WRITE(out, x);
  });
}

diopiError_t diopi_aten_silu_backward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                      diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t self) {
  if (grad_input != nullptr && grad_output != nullptr && self != nullptr &&
      dense_float32(grad_input, {grad_output, self}) && !planted_wrong(__func__)) {
    silu_backward_float32(static_cast<const float*>(grad_output->data), static_cast<const float*>(self->data),
                          static_cast<float*>(grad_input->data), numel(shape_of(grad_input)));
    return DIOPI_SUCCESS;
  }
  return binary(__func__, grad_input, grad_output, self, [](auto* tag, double g, double x) {
    return silu_grad_of<std::remove_pointer_t<decltype(tag)>>(g, x);
  });
}

diopiError_t diopi_aten_gelu_backward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                      diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t self,
                                      int64_t approximate) {
  if (diopiError_t err = guarded(__func__, [&] { check_approximate(approximate); })) return err;
  return binary(__func__, grad_input, grad_output, self,
                [approximate](double g, double x) { return g * gelu_grad(x, approximate); });
}

diopiError_t diopi_aten_sigmoid_backward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                         diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output) {
  return binary(__func__, grad_input, grad_output, output, [](double g, double y) { return g * y * (1.0 - y); });
}

}  // extern "C"

extern "C" {

diopiError_t diopi_aten_addcdiv(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2, double value) {
  if (dense(__func__, DenseOp::kAddcdiv, out, self, tensor1, tensor2, value)) return DIOPI_SUCCESS;
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self"), need(tensor1, "tensor1"), need(tensor2, "tensor2");
    require_float({out, self, tensor1, tensor2});
    const Shape shape = broadcast_shapes(broadcast_shapes(shape_of(self), shape_of(tensor1)), shape_of(tensor2));
    require_shape(out, shape, "out");
    const auto f = [value](double x, double a, double b) { return x + value * a / b; };
    if (elementwise_strided(kernel_name(__func__), out, shape, f, self, tensor1, tensor2)) return;
    Buffer x = read(self, shape);
    const Buffer a = read(tensor1, shape), b = read(tensor2, shape);
    for (size_t i = 0; i < x.size(); ++i) x[i] = f(x[i], a[i], b[i]);
    WRITE(out, x);
  });
}

diopiError_t diopi_aten_lerp_Scalar(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                    diopiConstTensorHandle_t end, double weight) {
  if (dense(__func__, DenseOp::kLerp, out, self, end, nullptr, weight)) return DIOPI_SUCCESS;
  return binary(__func__, out, self, end, [weight](double a, double b) { return a + weight * (b - a); });
}

diopiError_t diopi_aten_relu(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return unary(__func__, out, self, [](double x) { return std::isnan(x) || x > 0.0 ? x : 0.0; });
}

diopiError_t diopi_aten_threshold_backward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                          diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t self,
                                          double threshold) {
  return binary(__func__, grad_input, grad_output, self,
                [threshold](double g, double x) { return x <= threshold ? 0.0 : g; });
}

}  // extern "C"
