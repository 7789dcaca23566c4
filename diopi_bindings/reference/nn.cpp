// Neural-network kernels of a LLaMA step: softmax/log_softmax, RMSNorm, rotary embedding, attention,
// embedding and the NLL half of cross-entropy, each with its backward.
#include <cmath>
#include <limits>

#include "fast_exp.h"
#include "strided.h"
#include "tensor_io.h"

using namespace diopi_ref;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Softmax (log=false) or log-softmax along `dim` of a dense buffer; `safe`: a slice that is -inf
// throughout gives zeros instead of NaN (_safe_softmax, for fully masked attention rows).
Buffer softmax(const Buffer& x, const Shape& shape, int64_t dim, bool log, bool safe = false) {
  const Split s = split_at(shape, dim);
  Buffer y(x.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t in = 0; in < s.inner; ++in) {
      auto at = [&](int64_t i) { return size_t((o * s.length + i) * s.inner + in); };
      double m = kNegInf, z = 0.0;
      for (int64_t i = 0; i < s.length; ++i) m = std::max(m, x[at(i)]);
      if (safe && m == kNegInf) {
        for (int64_t i = 0; i < s.length; ++i) y[at(i)] = 0.0;
        continue;
      }
      for (int64_t i = 0; i < s.length; ++i) z += std::exp(x[at(i)] - m);
      for (int64_t i = 0; i < s.length; ++i) y[at(i)] = log ? x[at(i)] - m - std::log(z) : std::exp(x[at(i)] - m) / z;
    }
  return y;
}

// d softmax: y * (g - sum(g*y)); d log_softmax: g - exp(y) * sum(g).
Buffer softmax_backward(const Buffer& g, const Buffer& y, const Shape& shape, int64_t dim, bool log) {
  const Split s = split_at(shape, dim);
  Buffer gi(g.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t in = 0; in < s.inner; ++in) {
      auto at = [&](int64_t i) { return size_t((o * s.length + i) * s.inner + in); };
      double dot = 0.0;
      for (int64_t i = 0; i < s.length; ++i) dot += log ? g[at(i)] : g[at(i)] * y[at(i)];
      for (int64_t i = 0; i < s.length; ++i)
        gi[at(i)] = log ? g[at(i)] - std::exp(y[at(i)]) * dot : y[at(i)] * (g[at(i)] - dot);
    }
  return gi;
}

// The common case, (log-)softmax over the last dim of dense tensors of one floating dtype: rows read and
// written in place, each exp computed once and kept for the row. Float64 rows give the same bits as softmax()
// above; float32/bf16/fp16 rows take exp in float32 arithmetic (fast_exp.h, <= 2 ulp), the rest as above.
// False where the buffered path must serve.
bool softmax_rows(const char* symbol, diopiTensorHandle_t out, diopiConstTensorHandle_t self, int64_t dim, bool log,
                  bool safe) {
  if (planted_wrong(symbol) || out->dtype != self->dtype || self->ndim == 0 || dim != self->ndim - 1 ||
      !contiguous(self) || !contiguous(out))
    return false;
  bool ok = true;
  const bool is_float = with_float_type(out->dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (partly_overlap(out, self, int64_t(sizeof(T)))) {
      ok = false;
      return;
    }
    const int64_t n = self->shape[dim], rows = n ? numel(shape_of(self)) / n : 0;
    std::vector<double> e(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = static_cast<const T*>(self->data) + r * n;
      T* y = static_cast<T*>(out->data) + r * n;
      double m = kNegInf, z = 0.0;
      for (int64_t i = 0; i < n; ++i) m = std::max(m, load_double(x + i));
      if (safe && m == kNegInf) {
        for (int64_t i = 0; i < n; ++i) store_double(y + i, 0.0);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) e[size_t(i)] = exp_as<T>(load_double(x + i) - m);  // vectorizes
      for (int64_t i = 0; i < n; ++i) z += e[size_t(i)];  // in order: the same sum as softmax() above
      if (log) {
        const double lz = std::log(z);
        for (int64_t i = 0; i < n; ++i) store_double(y + i, load_double(x + i) - m - lz);
      } else {
        for (int64_t i = 0; i < n; ++i) store_double(y + i, e[size_t(i)] / z);
      }
    }
  });
  return is_float && ok;
}

// softmax_backward() above over the last dim of dense tensors of one floating dtype, in place; false otherwise.
bool softmax_backward_rows(const char* symbol, diopiTensorHandle_t gi, diopiConstTensorHandle_t g,
                           diopiConstTensorHandle_t y, int64_t dim, bool log) {
  if (planted_wrong(symbol) || gi->dtype != g->dtype || gi->dtype != y->dtype || y->ndim == 0 ||
      dim != y->ndim - 1 || !contiguous(gi) || !contiguous(g) || !contiguous(y))
    return false;
  bool ok = true;
  const bool is_float = with_float_type(gi->dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (partly_overlap(gi, g, int64_t(sizeof(T))) || partly_overlap(gi, y, int64_t(sizeof(T)))) {
      ok = false;
      return;
    }
    const int64_t n = y->shape[dim], rows = n ? numel(shape_of(y)) / n : 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* gr = static_cast<const T*>(g->data) + r * n;
      const T* yr = static_cast<const T*>(y->data) + r * n;
      T* out = static_cast<T*>(gi->data) + r * n;
      double dot = 0.0;
      for (int64_t i = 0; i < n; ++i) dot += log ? load_double(gr + i) : load_double(gr + i) * load_double(yr + i);
      for (int64_t i = 0; i < n; ++i) {
        const double gv = load_double(gr + i), yv = load_double(yr + i);
        store_double(out + i, log ? gv - exp_as<T>(yv) * dot : yv * (gv - dot));
      }
    }
  });
  return is_float && ok;
}

diopiError_t softmax_kernel(const char* symbol, diopiTensorHandle_t out, diopiConstTensorHandle_t self, int64_t dim,
                            bool log) {
  return guarded(symbol, [&] {
    need(out, "out"), need(self, "self");
    require_float({out, self});
    require_shape(out, shape_of(self), "out");
    const int64_t d = normalize_dim(dim, self->ndim);
    if (softmax_rows(symbol, out, self, d, log, false)) return;
    write_output(out, softmax(read(self), shape_of(self), d, log), symbol);
  });
}

diopiError_t softmax_backward_kernel(const char* symbol, diopiTensorHandle_t grad_input,
                                     diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output,
                                     int64_t dim, bool log) {
  return guarded(symbol, [&] {
    need(grad_input, "grad_input"), need(grad_output, "grad_output"), need(output, "output");
    require_float({grad_input, grad_output, output});
    const Shape shape = shape_of(output);
    require_shape(grad_output, shape, "grad_output");
    require_shape(grad_input, shape, "grad_input");
    const int64_t d = normalize_dim(dim, output->ndim);
    if (softmax_backward_rows(symbol, grad_input, grad_output, output, d, log)) return;
    write_output(grad_input, softmax_backward(read(grad_output), read(output), shape, d, log), symbol);
  });
}

// Rows and row length of an RMSNorm over the trailing `normalized` dims.
std::pair<int64_t, int64_t> norm_rows(const Shape& shape, diopiSize_t normalized) {
  const int64_t m = normalized.len;
  if (m > int64_t(shape.size()))
    fail(DIOPI_ERR_INVALID_ARGUMENT, "normalized_shape has more dims than the input " + to_string(shape));
  for (int64_t i = 0; i < m; ++i)
    if (shape[shape.size() - m + i] != normalized.data[i])
      fail(DIOPI_ERR_INVALID_ARGUMENT, "normalized_shape does not match the trailing dims of " + to_string(shape));
  const int64_t len = numel(Shape(normalized.data, normalized.data + m));
  return {len ? numel(shape) / len : 0, len};
}

int64_t check_index(int64_t i, int64_t size, const char* what) {
  if (i < 0 || i >= size)
    fail(DIOPI_ERR_INVALID_ARGUMENT,
         std::string(what) + " " + std::to_string(i) + " out of range [0, " + std::to_string(size) + ")");
  return i;
}

// (rows, dim) of an embedding table; `rows_out` must be indices' shape plus dim.
std::pair<int64_t, int64_t> embedding_table(diopiConstTensorHandle_t table, diopiConstTensorHandle_t indices,
                                            diopiConstTensorHandle_t rows_out, const char* rows_name) {
  require_index(indices, "indices");
  if (table->ndim != 2) fail(DIOPI_ERR_INVALID_ARGUMENT, "the embedding table must be (num_embeddings, dim)");
  Shape rows_shape = shape_of(indices);
  rows_shape.push_back(table->shape[1]);
  require_shape(rows_out, rows_shape, rows_name);
  return {table->shape[0], table->shape[1]};
}

}  // namespace

extern "C" {

diopiError_t diopi_aten__softmax(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                 int64_t dim, bool) {
  return softmax_kernel(__func__, out, self, dim, false);
}

diopiError_t diopi_aten__log_softmax(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                     int64_t dim, bool) {
  return softmax_kernel(__func__, out, self, dim, true);
}

diopiError_t diopi_aten__softmax_backward_data(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output,
                                               int64_t dim) {
  return softmax_backward_kernel(__func__, grad_input, grad_output, output, dim, false);
}

diopiError_t diopi_aten__safe_softmax(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                      int64_t dim) {
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self");
    require_float({out, self});
    require_shape(out, shape_of(self), "out");
    const int64_t d = normalize_dim(dim, self->ndim);
    if (softmax_rows(kernel_name(__func__), out, self, d, false, true)) return;
    WRITE(out, softmax(read(self), shape_of(self), d, false, true));
  });
}

diopiError_t diopi_aten__log_softmax_backward_data(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                                   diopiConstTensorHandle_t grad_output,
                                                   diopiConstTensorHandle_t output, int64_t dim) {
  return softmax_backward_kernel(__func__, grad_input, grad_output, output, dim, true);
}

diopiError_t diopi_aten__fused_rms_norm(diopiContextHandle_t, diopiTensorHandle_t out, diopiTensorHandle_t rstd,
                                        diopiConstTensorHandle_t input, diopiConstTensorHandle_t weight,
                                        diopiSize_t normalized_shape, double eps) {
  return guarded(__func__, [&] {
    need(out, "out"), need(rstd, "rstd"), need(input, "input");
    require_float({out, rstd, input, weight});
    const Shape shape = shape_of(input);
    const auto [rows, len] = norm_rows(shape, normalized_shape);
    require_shape(out, shape, "out");
    if (numel(shape_of(rstd)) != rows) fail(DIOPI_ERR_INVALID_ARGUMENT, "rstd must hold one value per row");
    const Shape wshape(normalized_shape.data, normalized_shape.data + normalized_shape.len);
    if (weight) require_shape(weight, wshape, "weight");  // as torch: a broadcastable weight is refused too
    const Buffer x = read(input);
    const Buffer w = weight ? read(weight) : Buffer(size_t(len), 1.0);
    Buffer y(x.size()), r(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      double ms = 0.0;
      for (int64_t j = 0; j < len; ++j) ms += x[size_t(i * len + j)] * x[size_t(i * len + j)];
      r[size_t(i)] = 1.0 / std::sqrt(ms / double(len) + eps);
      for (int64_t j = 0; j < len; ++j) y[size_t(i * len + j)] = x[size_t(i * len + j)] * r[size_t(i)] * w[size_t(j)];
    }
    WRITE(out, y);
    WRITE(rstd, r);
  });
}

diopiError_t diopi_aten__fused_rms_norm_backward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                                 diopiTensorHandle_t grad_weight, diopiConstTensorHandle_t grad_out,
                                                 diopiConstTensorHandle_t input, diopiConstTensorHandle_t rstd,
                                                 diopiConstTensorHandle_t weight, diopiSize_t normalized_shape) {
  return guarded(__func__, [&] {
    need(grad_input, "grad_input"), need(grad_out, "grad_out"), need(input, "input"), need(rstd, "rstd");
    require_float({grad_input, grad_weight, grad_out, input, rstd, weight});
    const Shape shape = shape_of(input);
    const auto [rows, len] = norm_rows(shape, normalized_shape);
    require_shape(grad_out, shape, "grad_out");
    require_shape(grad_input, shape, "grad_input");
    const Shape wshape(normalized_shape.data, normalized_shape.data + normalized_shape.len);
    if (weight) require_shape(weight, wshape, "weight");
    const Buffer x = read(input), g = read(grad_out), r = read(rstd);
    if (int64_t(r.size()) != rows) fail(DIOPI_ERR_INVALID_ARGUMENT, "rstd must hold one value per row");
    const Buffer w = weight ? read(weight) : Buffer(size_t(len), 1.0);
    Buffer gx(x.size()), gw(size_t(len), 0.0);
    for (int64_t i = 0; i < rows; ++i) {
      double dot = 0.0;  // mean over the row of (g*w) * xhat
      for (int64_t j = 0; j < len; ++j) {
        const size_t k = size_t(i * len + j);
        const double xhat = x[k] * r[size_t(i)];
        dot += g[k] * w[size_t(j)] * xhat;
        gw[size_t(j)] += g[k] * xhat;
      }
      dot /= double(len);
      for (int64_t j = 0; j < len; ++j) {
        const size_t k = size_t(i * len + j);
        gx[k] = r[size_t(i)] * (g[k] * w[size_t(j)] - x[k] * r[size_t(i)] * dot);
      }
    }
    WRITE(grad_input, gx);
    if (grad_weight != nullptr) {
      require_shape(grad_weight, wshape, "grad_weight");
      WRITE(grad_weight, gw);
    }
  });
}

diopiError_t diopi_ext_rotary_embedding(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t x,
                                        diopiConstTensorHandle_t cos, diopiConstTensorHandle_t sin, bool conj) {
  return guarded(__func__, [&] {
    need(out, "out"), need(x, "x"), need(cos, "cos"), need(sin, "sin");
    require_float({out, x, cos, sin});
    const Shape shape = shape_of(x);
    require_shape(out, shape, "out");
    if (shape.empty() || shape.back() % 2) fail(DIOPI_ERR_INVALID_ARGUMENT, "the last dim of x must be even");
    const Buffer v = read(x), c = read(cos, shape), s = read(sin, shape);
    const int64_t d = shape.back(), half = d / 2;
    Buffer y(v.size());
    const double sign = conj ? -1.0 : 1.0;
    for (size_t row = 0; row < v.size(); row += size_t(d))
      for (int64_t j = 0; j < d; ++j) {
        // rotate_half(x) = cat(-x[half:], x[:half])
        const double rot = j < half ? -v[row + size_t(j + half)] : v[row + size_t(j - half)];
        y[row + size_t(j)] = v[row + size_t(j)] * c[row + size_t(j)] + sign * rot * s[row + size_t(j)];
      }
    WRITE(out, y);
  });
}

diopiError_t diopi_aten__scaled_dot_product_flash_attention_for_cpu(
    diopiContextHandle_t, diopiTensorHandle_t output, diopiTensorHandle_t logsumexp, diopiConstTensorHandle_t query,
    diopiConstTensorHandle_t key, diopiConstTensorHandle_t value, bool is_causal, double scale) {
  return guarded(__func__, [&] {
    need(output, "output"), need(logsumexp, "logsumexp"), need(query, "query"), need(key, "key"), need(value, "value");
    require_float({output, logsumexp, query, key, value});
    if (query->ndim != 4 || key->ndim != 4 || value->ndim != 4)
      fail(DIOPI_ERR_INVALID_ARGUMENT, "query, key and value must be (batch, heads, seq, dim)");
    const int64_t B = query->shape[0], H = query->shape[1], S = query->shape[2], D = query->shape[3];
    const int64_t L = key->shape[2], Dv = value->shape[3];
    require_shape(key, {B, H, L, D}, "key");
    require_shape(value, {B, H, L, Dv}, "value");
    require_shape(output, {B, H, S, Dv}, "output");
    require_shape(logsumexp, {B, H, S}, "logsumexp");
    const Buffer q = read(query), k = read(key), v = read(value);
    Buffer o(static_cast<size_t>(B * H * S * Dv), 0.0), lse(static_cast<size_t>(B * H * S)), p(static_cast<size_t>(L));
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t i = 0; i < S; ++i) {
        double m = kNegInf;
        for (int64_t j = 0; j < L; ++j) {
          double dot = 0.0;
          for (int64_t t = 0; t < D; ++t) dot += q[size_t((bh * S + i) * D + t)] * k[size_t((bh * L + j) * D + t)];
          p[size_t(j)] = is_causal && j > i ? kNegInf : dot * scale;
          m = std::max(m, p[size_t(j)]);
        }
        double z = 0.0;
        for (int64_t j = 0; j < L; ++j) z += m == kNegInf ? 0.0 : std::exp(p[size_t(j)] - m);
        lse[size_t(bh * S + i)] = m + std::log(z);
        for (int64_t j = 0; j < L; ++j) {
          const double w = z == 0.0 ? 0.0 : std::exp(p[size_t(j)] - m) / z;
          for (int64_t t = 0; t < Dv; ++t) o[size_t((bh * S + i) * Dv + t)] += w * v[size_t((bh * L + j) * Dv + t)];
        }
      }
    WRITE(output, o);
    WRITE(logsumexp, lse);
  });
}

diopiError_t diopi_aten__scaled_dot_product_flash_attention_for_cpu_backward(
    diopiContextHandle_t, diopiTensorHandle_t grad_query, diopiTensorHandle_t grad_key, diopiTensorHandle_t grad_value,
    diopiConstTensorHandle_t grad_out, diopiConstTensorHandle_t query, diopiConstTensorHandle_t key,
    diopiConstTensorHandle_t value, diopiConstTensorHandle_t out, diopiConstTensorHandle_t logsumexp, bool is_causal,
    double scale) {
  return guarded(__func__, [&] {
    for (auto t : {grad_out, query, key, value, out, logsumexp}) need(t, "an attention input");
    need(grad_query, "grad_query"), need(grad_key, "grad_key"), need(grad_value, "grad_value");
    require_float({grad_query, grad_key, grad_value, grad_out, query, key, value, out, logsumexp});
    if (query->ndim != 4 || key->ndim != 4 || value->ndim != 4)
      fail(DIOPI_ERR_INVALID_ARGUMENT, "query, key and value must be (batch, heads, seq, dim)");
    const int64_t B = query->shape[0], H = query->shape[1], S = query->shape[2], D = query->shape[3];
    const int64_t L = key->shape[2], Dv = value->shape[3];
    require_shape(grad_out, {B, H, S, Dv}, "grad_out");
    require_shape(grad_query, shape_of(query), "grad_query");
    require_shape(grad_key, shape_of(key), "grad_key");
    require_shape(grad_value, shape_of(value), "grad_value");
    const Buffer q = read(query), k = read(key), v = read(value), o = read(out), g = read(grad_out);
    const Buffer lse = read(logsumexp, {B, H, S});
    Buffer gq(q.size(), 0.0), gk(k.size(), 0.0), gv(v.size(), 0.0);
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t i = 0; i < S; ++i) {
        const size_t row = size_t(bh * S + i);
        double delta = 0.0;  // sum_t dO * O
        for (int64_t t = 0; t < Dv; ++t) delta += g[row * Dv + t] * o[row * Dv + t];
        for (int64_t j = 0; j < L; ++j) {
          if (is_causal && j > i) continue;
          double dot = 0.0;
          for (int64_t t = 0; t < D; ++t) dot += q[row * D + t] * k[size_t((bh * L + j) * D + t)];
          const double pij = std::exp(dot * scale - lse[row]);
          double dp = 0.0;
          for (int64_t t = 0; t < Dv; ++t) {
            dp += g[row * Dv + t] * v[size_t((bh * L + j) * Dv + t)];
            gv[size_t((bh * L + j) * Dv + t)] += pij * g[row * Dv + t];
          }
          const double ds = pij * (dp - delta) * scale;
          for (int64_t t = 0; t < D; ++t) {
            gq[row * D + t] += ds * k[size_t((bh * L + j) * D + t)];
            gk[size_t((bh * L + j) * D + t)] += ds * q[row * D + t];
          }
        }
      }
    WRITE(grad_query, gq);
    WRITE(grad_key, gk);
    WRITE(grad_value, gv);
  });
}

diopiError_t diopi_aten_embedding(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t weight,
                                  diopiConstTensorHandle_t indices, int64_t) {
  return guarded(__func__, [&] {
    need(out, "out"), need(weight, "weight"), need(indices, "indices");
    require_float({out, weight});
    const auto [n, d] = embedding_table(weight, indices, out, "out");
    const Buffer w = read(weight);
    const std::vector<int64_t> idx = read_index(indices);
    Buffer y(idx.size() * size_t(d));
    for (size_t r = 0; r < idx.size(); ++r) {
      const int64_t i = check_index(idx[r], n, "index");
      for (int64_t j = 0; j < d; ++j) y[r * size_t(d) + size_t(j)] = w[size_t(i * d + j)];
    }
    WRITE(out, y);
  });
}

diopiError_t diopi_aten_embedding_dense_backward(diopiContextHandle_t, diopiTensorHandle_t grad_weight,
                                                 diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t indices,
                                                 int64_t padding_idx, bool scale_grad_by_freq) {
  return guarded(__func__, [&] {
    need(grad_weight, "grad_weight"), need(grad_output, "grad_output"), need(indices, "indices");
    require_float({grad_weight, grad_output});
    const auto [n, d] = embedding_table(grad_weight, indices, grad_output, "grad_output");
    const Buffer g = read(grad_output);
    const std::vector<int64_t> idx = read_index(indices);
    std::vector<int64_t> count(size_t(n), 0);
    for (int64_t i : idx) ++count[size_t(check_index(i, n, "index"))];
    Buffer gw(size_t(n * d), 0.0);
    for (size_t r = 0; r < idx.size(); ++r) {
      if (idx[r] == padding_idx) continue;
      const double f = scale_grad_by_freq ? 1.0 / double(count[size_t(idx[r])]) : 1.0;
      for (int64_t j = 0; j < d; ++j) gw[size_t(idx[r] * d + j)] += f * g[r * size_t(d) + size_t(j)];
    }
    WRITE(grad_weight, gw);
  });
}

diopiError_t diopi_aten_nll_loss_forward(diopiContextHandle_t, diopiTensorHandle_t output,
                                         diopiTensorHandle_t total_weight, diopiConstTensorHandle_t self,
                                         diopiConstTensorHandle_t target, diopiConstTensorHandle_t weight,
                                         int64_t reduction, int64_t ignore_index) {
  return guarded(__func__, [&] {
    need(output, "output"), need(total_weight, "total_weight"), need(self, "self"), need(target, "target");
    require_float({output, total_weight, self, weight});
    require_index(target, "target");
    if (self->ndim != 1 && self->ndim != 2) fail(DIOPI_ERR_INVALID_ARGUMENT, "self must be (N, C) or (C,)");
    if (reduction < 0 || reduction > 2) fail(DIOPI_ERR_INVALID_ARGUMENT, "reduction must be 0, 1 or 2");
    const int64_t N = self->ndim == 2 ? self->shape[0] : 1, C = self->shape[self->ndim - 1];
    require_shape(target, self->ndim == 2 ? Shape{N} : Shape{}, "target");
    require_shape(output, reduction == 0 && self->ndim == 2 ? Shape{N} : Shape{}, "output");
    const Buffer x = read(self);
    if (weight) require_shape(weight, {C}, "weight");  // as torch: one weight per class, never broadcast
    const Buffer w = weight ? read(weight) : Buffer(size_t(C), 1.0);
    const std::vector<int64_t> t = read_index(target);
    Buffer losses(size_t(N), 0.0);
    double total = 0.0, sum = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      if (t[size_t(n)] == ignore_index) continue;
      const int64_t c = check_index(t[size_t(n)], C, "target");
      losses[size_t(n)] = -w[size_t(c)] * x[size_t(n * C + c)];
      total += w[size_t(c)];
      sum += losses[size_t(n)];
    }
    WRITE(output, reduction == 0 ? losses : Buffer{reduction == 1 ? sum / total : sum});
    WRITE(total_weight, Buffer{reduction == 0 ? 0.0 : total});  // as ATen: unused without reduction
  });
}

diopiError_t diopi_aten_nll_loss_backward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                          diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t self,
                                          diopiConstTensorHandle_t target, diopiConstTensorHandle_t weight,
                                          diopiConstTensorHandle_t total_weight, int64_t reduction,
                                          int64_t ignore_index) {
  return guarded(__func__, [&] {
    need(grad_input, "grad_input"), need(grad_output, "grad_output"), need(self, "self"), need(target, "target");
    need(total_weight, "total_weight");
    require_float({grad_input, grad_output, self, weight, total_weight});
    require_index(target, "target");
    if (self->ndim != 1 && self->ndim != 2) fail(DIOPI_ERR_INVALID_ARGUMENT, "self must be (N, C) or (C,)");
    const int64_t N = self->ndim == 2 ? self->shape[0] : 1, C = self->shape[self->ndim - 1];
    require_shape(grad_input, shape_of(self), "grad_input");
    const Buffer g = read(grad_output);
    if (weight) require_shape(weight, {C}, "weight");  // as torch: one weight per class, never broadcast
    const Buffer w = weight ? read(weight) : Buffer(size_t(C), 1.0);
    const double total = read(total_weight)[0];
    const std::vector<int64_t> t = read_index(target);
    Buffer gi(size_t(N * C), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (t[size_t(n)] == ignore_index) continue;
      const int64_t c = check_index(t[size_t(n)], C, "target");
      const double gn = reduction == 0 && self->ndim == 2 ? g[size_t(n)] : g[0];
      gi[size_t(n * C + c)] = -w[size_t(c)] * (reduction == 1 ? gn / total : gn);
    }
    WRITE(grad_input, gi);
  });
}

}  // extern "C"
