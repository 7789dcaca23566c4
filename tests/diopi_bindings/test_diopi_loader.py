"""Loading libraries (dlopen): what they implement, their version, clear refusals of malformed ones,
and operator errors surfacing with the library's message."""
from __future__ import annotations

import pytest
import torch
from diopi_testlib import METADATA_C, compile_c_library

from diopi_bindings.library import DiopiLibrary, LibraryError, OperatorError, load


def test_reference_reports_vendor_and_version(reference_path):
    lib = DiopiLibrary(reference_path)
    assert (lib.vendor, lib.version) == ("reference-cpu", "0.1.0")


def test_diopi_library_environment_variable_selects_the_library(monkeypatch, variant_path):
    monkeypatch.setenv("DIOPI_LIBRARY", str(variant_path))
    assert load().path == str(variant_path)


def test_missing_version_symbol_is_refused(tmp_path):
    src = '#include "diopi/functions.h"\nconst char* diopi_vendor_name(void) { return "x"; }\n'
    path = compile_c_library(tmp_path, "noversion", src)
    with pytest.raises(LibraryError, match=r"not a DIOPI library: it does not export diopi_abi_version.*diopirt\.h"):
        DiopiLibrary(path)


def test_wrong_abi_version_is_refused(tmp_path):
    path = compile_c_library(tmp_path, "future", METADATA_C % {"abi": "999"})
    with pytest.raises(LibraryError, match=r"built for DIOPI ABI 999, this framework speaks ABI 1: rebuild"):
        DiopiLibrary(path)


def test_not_a_shared_library_is_refused(tmp_path):
    bogus = tmp_path / "libbogus.so"
    bogus.write_text("not an ELF file")
    with pytest.raises(LibraryError, match="cannot load DIOPI library"):
        DiopiLibrary(bogus)
    with pytest.raises(LibraryError, match="does not exist"):
        DiopiLibrary(tmp_path / "absent.so")


def test_operator_error_carries_the_library_message(reference_path):
    lib = DiopiLibrary(reference_path)
    x = torch.randn(5, 6)
    with pytest.raises(OperatorError, match=r"invalid argument.*out has shape \[3, 5\], expected \[5, 6\]"):
        lib.call("aten::silu", torch.empty(3, 5), x)
    with pytest.raises(OperatorError, match="unsupported dtype"):
        lib.call("aten::silu", torch.empty(5, 6, dtype=torch.int64), x)
    with pytest.raises(OperatorError, match=r"index 10 out of range \[0, 4\)"):
        lib.call("aten::embedding", torch.empty(1, 3), torch.randn(4, 3), torch.tensor([10]), -1)


@pytest.mark.parametrize("weight_shape", [(1,), (2, 3)])
def test_rms_norm_refuses_a_weight_not_shaped_like_normalized_shape(reference_path, weight_shape):
    """torch refuses it; broadcasting it (one scale for every column) would pass silently."""
    lib = DiopiLibrary(reference_path)
    x, w = torch.randn(5, 6), torch.ones(weight_shape)
    with pytest.raises(RuntimeError, match="same shape as normalized_shape"):
        torch.nn.functional.rms_norm(x, [6], weight=w)
    expected = rf"weight has shape \[{', '.join(map(str, weight_shape))}\], expected \[6\]"
    with pytest.raises(OperatorError, match=expected):
        lib.call("aten::_fused_rms_norm", torch.empty(5, 6), torch.empty(5, 1), x, w, [6], 1e-6)
    with pytest.raises(OperatorError, match=expected):
        lib.call("aten::_fused_rms_norm_backward", torch.empty(5, 6), torch.empty(6), torch.randn(5, 6), x,
                 torch.ones(5, 1), w, [6])


def test_nll_loss_refuses_a_weight_not_one_per_class(reference_path):
    """torch refuses it; broadcasting a (1,) weight to every class would pass silently."""
    lib = DiopiLibrary(reference_path)
    x, t, w = torch.randn(4, 3).log_softmax(1), torch.tensor([0, 1, 2, 0]), torch.ones(1)
    with pytest.raises(RuntimeError, match="weight tensor should be defined either for all 3 classes"):
        torch.nn.functional.nll_loss(x, t, weight=w)
    with pytest.raises(OperatorError, match=r"weight has shape \[1\], expected \[3\]"):
        lib.call("aten::nll_loss_forward", torch.empty(()), torch.empty(()), x, t, w, 1, -100)
    with pytest.raises(OperatorError, match=r"weight has shape \[1\], expected \[3\]"):
        lib.call("aten::nll_loss_backward", torch.empty(4, 3), torch.ones(()), x, t, w, torch.tensor(4.0), 1, -100)


def test_calls_match_torch_through_strides_and_broadcast(reference_path):
    lib = DiopiLibrary(reference_path)
    a, b = torch.randn(6, 5).t(), torch.randn(6)
    out = torch.empty(6, 5).t()  # written through transposed strides
    lib.call("aten::add.Tensor", out, a, b, 0.5)
    torch.testing.assert_close(out, a + 0.5 * b)


def test_reused_handles_follow_shape_stride_and_dtype_changes(reference_path):
    """A handle is kept per sizes and strides and refilled where the tensor differs: check each change, then
    the same shapes again (known handles, another dtype), then more shapes than a position keeps."""
    lib = DiopiLibrary(reference_path)
    base = torch.randn(4, 4, dtype=torch.float64)
    seen = (base, base.t(), base[:2], base.float(), base.t().float(), base.reshape(2, 8), base[0, 0])
    many = [torch.randn(n, 3)[:, ::2] for n in range(1, 80)]
    for x in (*seen, *seen[::-1], *(t.double() for t in seen), *many, *many[::-1]):
        out = torch.empty_like(x)
        lib.call("aten::neg", out, x)
        assert torch.equal(out, -x), (x.shape, x.stride(), x.dtype)


def test_a_tensor_list_reaches_the_kernel(tmp_path, reference_path):
    """``in[]`` arguments travel as a diopiTensorList_t: a plain C kernel reads each handle of the list
    (count, shapes, data), and the reference's cat joins non-contiguous parts like torch.cat."""
    src = METADATA_C % {"abi": "DIOPI_ABI_VERSION"} + """
diopiError_t diopi_aten_cat(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorList_t tensors,
                            int64_t dim) {
  /* 1-dim float64 parts only: enough to see the list's layout from C */
  int64_t k = 0;
  if (dim != 0) return DIOPI_ERR_NOT_IMPLEMENTED;
  for (int64_t t = 0; t < tensors.len; ++t) {
    diopiConstTensorHandle_t part = tensors.data[t];
    for (int64_t i = 0; i < part->shape[0]; ++i)
      ((double*)out->data)[k++] = ((const double*)part->data)[i * part->strides[0]];
  }
  return k == out->shape[0] ? DIOPI_SUCCESS : DIOPI_ERR_INVALID_ARGUMENT;
}
"""
    lib = DiopiLibrary(compile_c_library(tmp_path, "listing", src))
    parts = [torch.arange(3.0, dtype=torch.float64), torch.arange(10.0, dtype=torch.float64)[::3],
             torch.empty(0, dtype=torch.float64), torch.tensor([-1.0], dtype=torch.float64)]
    out = torch.empty(8, dtype=torch.float64)
    lib.call("aten::cat", out, parts, 0)
    assert torch.equal(out, torch.cat(parts))

    ref = DiopiLibrary(reference_path)
    a, b = torch.randn(5, 2), torch.randn(4, 5).t()  # b non-contiguous
    out = torch.empty(5, 6)
    ref.call("aten::cat", out, [a, b], 1)
    assert torch.equal(out, torch.cat([a, b], 1))
    with pytest.raises(OperatorError, match="add up to 6 along dim 1, out has 7"):
        ref.call("aten::cat", torch.empty(5, 7), [a, b], 1)


def test_kernels_allocate_through_the_context(tmp_path):
    """A kernel takes scratch memory and a scratch tensor from the framework's allocator (the context's
    callbacks); the block goes back by release, the tensor is dropped when the call returns."""
    src = METADATA_C % {"abi": "DIOPI_ABI_VERSION"} + """
#include <string.h>
diopiError_t diopi_aten_neg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  double* scratch = (double*)ctx->allocate(ctx->allocator_state, 4 * sizeof(double));
  if (!scratch) return DIOPI_ERR_ALLOCATION;
  diopiTensorHandle_t extra = NULL;
  int64_t shape[2] = {2, 3};
  if (ctx->require_tensor(ctx->allocator_state, &extra, 2, shape, DIOPI_DTYPE_FLOAT64) != DIOPI_SUCCESS)
    return DIOPI_ERR_ALLOCATION;
  if (extra->ndim != 2 || extra->shape[1] != 3 || extra->dtype != DIOPI_DTYPE_FLOAT64) return DIOPI_ERR_INTERNAL;
  memset(extra->data, 0, 6 * sizeof(double));
  for (int64_t i = 0; i < self->shape[0]; ++i) {
    scratch[i % 4] = -((const double*)self->data)[i * self->strides[0]];
    ((double*)out->data)[i * out->strides[0]] = scratch[i % 4];
  }
  ctx->release(ctx->allocator_state, scratch);
  return DIOPI_SUCCESS;
}
"""
    lib = DiopiLibrary(compile_c_library(tmp_path, "allocating", src))
    x = torch.arange(5, dtype=torch.float64)
    out = torch.empty(5, dtype=torch.float64)
    lib.call("aten::neg", out, x)
    assert torch.equal(out, -x)
    assert lib.allocator.blocks == {}  # the scratch block went back
    assert not lib.allocator.holds_required()  # and the scratch tensor with the call


NONZERO_C = """
#include <string.h>
diopiError_t diopi_aten_nonzero(diopiContextHandle_t ctx, diopiTensorHandle_t* out, diopiConstTensorHandle_t self) {
  int64_t n = 0, shape[2];
  for (int64_t i = 0; i < self->shape[0]; ++i) n += ((const double*)self->data)[i * self->strides[0]] != 0.0;
  shape[0] = n; shape[1] = 1;
  if (%(allocate)s) {
    diopiError_t code = ctx->require_tensor(ctx->allocator_state, out, 2, shape, DIOPI_DTYPE_INT64);
    if (code != DIOPI_SUCCESS) return code;
    for (int64_t i = 0, k = 0; i < self->shape[0]; ++i)
      if (((const double*)self->data)[i * self->strides[0]] != 0.0) ((int64_t*)(*out)->data)[k++] = i;
  }
  return DIOPI_SUCCESS;
}
"""


def test_an_output_whose_size_depends_on_the_data_comes_back_from_the_call(tmp_path):
    """nonzero's output (kind out*) is allocated by the kernel through ctx->require_tensor: call() takes the
    device to allocate on and returns the tensor. A kernel that returns success without allocating it is an
    error naming the output. Reference: torch.nonzero."""
    x = torch.tensor([0.0, 2.0, 0.0, -1.0, float("nan")], dtype=torch.float64)
    lib = DiopiLibrary(compile_c_library(tmp_path, "nonzero", METADATA_C % {"abi": "DIOPI_ABI_VERSION"}
                                         + NONZERO_C % {"allocate": 1}))
    (got,) = lib.call("aten::nonzero", None, x)
    assert torch.equal(got, torch.nonzero(x)) and not lib.allocator.holds_required()
    lazy = DiopiLibrary(compile_c_library(tmp_path, "lazy", METADATA_C % {"abi": "DIOPI_ABI_VERSION"}
                                          + NONZERO_C % {"allocate": 0}))
    with pytest.raises(OperatorError, match="returned success without allocating out through ctx->require_tensor"):
        lazy.call("aten::nonzero", None, x)


def test_a_list_of_optional_tensors_carries_none_as_a_full_slice(reference_path):
    """index.Tensor's indices travel as a list whose entries may be NULL; torch's x[:, idx] is the reference."""
    lib = DiopiLibrary(reference_path)
    x, idx = torch.randn(3, 4, 5, dtype=torch.float64), torch.tensor([[3, 0], [1, 1]])
    out = torch.empty(3, 2, 2, 5, dtype=torch.float64)
    lib.call("aten::index.Tensor", out, x, [None, idx])
    assert torch.equal(out, x[:, idx])
    with pytest.raises(TypeError, match="a list entry is None"):  # cat's list is not optional
        lib.call("aten::cat", torch.empty(2), [torch.ones(1), None], 0)
    with pytest.raises(OperatorError, match="index 4 is out of bounds for dim 1 with size 4"):
        lib.call("aten::index.Tensor", torch.empty(3, 1, 5, dtype=torch.float64), x, [None, torch.tensor([4])])

