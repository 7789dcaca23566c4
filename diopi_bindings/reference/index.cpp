// Advanced indexing: index.Tensor (out = self[indices]) and index_put (out = self with self[indices] set to,
// or accumulating, values), the cross-entropy backward's grad[rows, targets] -= ... . `indices` is a list
// of optional index tensors: a NULL entry (and every dim past the list) is a full slice ':'. The defined
// entries broadcast to one shape B; if they are adjacent, B replaces their dims in place, else B leads and
// the sliced dims follow (torch's rule). Negative indices count from the end.
#include <string>

#include "tensor_io.h"

using namespace diopi_ref;

namespace {

struct Indexing {
  Shape self_shape, result_shape;
  std::vector<int64_t> before, after;        // sliced dims of self placed before / after B in the result
  std::vector<int64_t> indexed;              // dims of self with an index tensor
  std::vector<std::vector<int64_t>> values;  // each index tensor broadcast to B, row-major
  Shape b_shape;
};

Indexing plan(diopiConstTensorHandle_t self, diopiTensorList_t indices) {
  Indexing p;
  p.self_shape = shape_of(self);
  const int64_t nd = int64_t(p.self_shape.size());
  if (indices.len > nd)
    fail(DIOPI_ERR_INVALID_ARGUMENT, "too many indices (" + std::to_string(indices.len) + ") for a tensor of " +
                                         std::to_string(nd) + " dims");
  for (int64_t k = 0; k < indices.len; ++k) {
    diopiConstTensorHandle_t t = indices.data[k];
    if (t == nullptr) continue;
    require_index(t, "indices");
    p.b_shape = p.indexed.empty() ? shape_of(t) : broadcast_shapes(p.b_shape, shape_of(t));
    p.indexed.push_back(k);
  }
  if (p.indexed.empty()) fail(DIOPI_ERR_INVALID_ARGUMENT, "indices has no index tensor (all entries NULL)");
  const bool adjacent = p.indexed.back() - p.indexed.front() + 1 == int64_t(p.indexed.size());
  for (int64_t k = 0; k < nd; ++k) {
    bool is_indexed = false;
    for (int64_t d : p.indexed) is_indexed = is_indexed || d == k;
    if (is_indexed) continue;
    (adjacent && k < p.indexed.front() ? p.before : p.after).push_back(k);
  }
  for (int64_t d : p.before) p.result_shape.push_back(p.self_shape[size_t(d)]);
  for (int64_t s : p.b_shape) p.result_shape.push_back(s);
  for (int64_t d : p.after) p.result_shape.push_back(p.self_shape[size_t(d)]);
  for (int64_t d : p.indexed) {
    const Buffer raw = read(indices.data[d], p.b_shape);
    const int64_t size = p.self_shape[size_t(d)];
    std::vector<int64_t> wrapped(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      const int64_t v = int64_t(raw[i]);
      if (v < -size || v >= size)
        fail(DIOPI_ERR_INVALID_ARGUMENT, "index " + std::to_string(v) + " is out of bounds for dim " +
                                             std::to_string(d) + " with size " + std::to_string(size));
      wrapped[i] = v < 0 ? v + size : v;
    }
    p.values.push_back(std::move(wrapped));
  }
  return p;
}

// The row-major offset in self of every result element, in result order.
std::vector<int64_t> sources(const Indexing& p) {
  const int64_t nd = int64_t(p.self_shape.size());
  Shape stride(size_t(nd), 1);
  for (int64_t k = nd - 2; k >= 0; --k) stride[size_t(k)] = stride[size_t(k + 1)] * p.self_shape[size_t(k + 1)];
  const int64_t total = numel(p.result_shape);
  std::vector<int64_t> out(static_cast<size_t>(total));
  const size_t nb = p.before.size(), nbd = p.b_shape.size();
  Shape coord(p.result_shape.size(), 0);
  for (int64_t lin = 0; lin < total; ++lin) {
    int64_t b_lin = 0;  // the position in B
    for (size_t i = 0; i < nbd; ++i) b_lin = b_lin * p.b_shape[i] + coord[nb + i];
    int64_t source = 0;
    for (size_t i = 0; i < nb; ++i) source += coord[i] * stride[size_t(p.before[i])];
    for (size_t i = 0; i < p.after.size(); ++i) source += coord[nb + nbd + i] * stride[size_t(p.after[i])];
    for (size_t j = 0; j < p.indexed.size(); ++j)
      source += p.values[j][size_t(b_lin)] * stride[size_t(p.indexed[j])];
    out[size_t(lin)] = source;
    for (int64_t k = int64_t(coord.size()) - 1; k >= 0; --k) {
      if (++coord[size_t(k)] < p.result_shape[size_t(k)]) break;
      coord[size_t(k)] = 0;
    }
  }
  return out;
}

}  // namespace

extern "C" DIOPI_API diopiError_t diopi_aten_index_Tensor(diopiContextHandle_t, diopiTensorHandle_t out,
                                                          diopiConstTensorHandle_t self, diopiTensorList_t indices) {
  return guarded("diopi_aten_index_Tensor", [&] {
    need(out, "out"), need(self, "self");
    const Indexing p = plan(self, indices);
    require_shape(out, p.result_shape, "out");
    const Buffer values = read(self);
    const std::vector<int64_t> src = sources(p);
    Buffer result(src.size());
    for (size_t i = 0; i < src.size(); ++i) result[i] = values[size_t(src[i])];
    WRITE(out, result);
  });
}

extern "C" DIOPI_API diopiError_t diopi_aten_index_put(diopiContextHandle_t, diopiTensorHandle_t out,
                                                       diopiConstTensorHandle_t self, diopiTensorList_t indices,
                                                       diopiConstTensorHandle_t values, bool accumulate) {
  return guarded("diopi_aten_index_put", [&] {
    need(out, "out"), need(self, "self"), need(values, "values");
    const Indexing p = plan(self, indices);
    require_shape(out, p.self_shape, "out");
    const Shape vshape = shape_of(values);
    if (broadcast_shapes(vshape, p.result_shape) != p.result_shape)
      fail(DIOPI_ERR_INVALID_ARGUMENT, "values " + to_string(vshape) + " do not broadcast to the indexed shape " +
                                           to_string(p.result_shape));
    Buffer result = read(self);
    const Buffer v = read(values, p.result_shape);
    const std::vector<int64_t> src = sources(p);
    for (size_t i = 0; i < src.size(); ++i) {
      double& slot = result[size_t(src[i])];
      slot = accumulate ? slot + v[i] : v[i];
    }
    WRITE(out, result);
  });
}
