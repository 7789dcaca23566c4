// One AdamW step per parameter tensor, with torch.optim.AdamW's arithmetic (decoupled weight decay,
// bias corrections folded into the step size and the denominator).
#include <cmath>

#include "tensor_io.h"

using namespace diopi_ref;

extern "C" {

diopiError_t diopi_ext_adamw(diopiContextHandle_t, diopiTensorHandle_t param, diopiTensorHandle_t exp_avg,
                             diopiTensorHandle_t exp_avg_sq, diopiConstTensorHandle_t grad, double lr, double beta1,
                             double beta2, double weight_decay, double eps, int64_t step, bool maximize) {
  return guarded(__func__, [&] {
    need(param, "param"), need(exp_avg, "exp_avg"), need(exp_avg_sq, "exp_avg_sq"), need(grad, "grad");
    require_float({param, exp_avg, exp_avg_sq, grad});
    const Shape shape = shape_of(param);
    for (auto [t, name] : {std::pair{static_cast<diopiConstTensorHandle_t>(exp_avg), "exp_avg"},
                           {exp_avg_sq, "exp_avg_sq"}, {grad, "grad"}})
      require_shape(t, shape, name);
    if (step < 1) fail(DIOPI_ERR_INVALID_ARGUMENT, "step counts from 1");
    Buffer p = read(param), m = read(exp_avg), v = read(exp_avg_sq);
    const Buffer g = read(grad);
    const double bc1 = 1.0 - std::pow(beta1, double(step)), bc2 = 1.0 - std::pow(beta2, double(step));
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = maximize ? -g[i] : g[i];
      p[i] *= 1.0 - lr * weight_decay;
      m[i] = beta1 * m[i] + (1.0 - beta1) * gi;
      v[i] = beta2 * v[i] + (1.0 - beta2) * gi * gi;
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
    WRITE(param, p);
    WRITE(exp_avg, m);
    WRITE(exp_avg_sq, v);
  });
}

}  // extern "C"
