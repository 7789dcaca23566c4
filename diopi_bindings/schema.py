"""The operator set of the DIOPI ABI, keyed by ATen operator names: the single source of truth.

Every C signature in ``include/diopi/functions.h`` is generated from this table
(``python -m diopi_bindings.gen_header``), the Python loader builds its ctypes prototypes from it,
and the conformance suite and the torch device look operators up by the same ATen names.
Operators without an ATen counterpart live in the ``ext`` namespace.

Argument order in C: the context, then outputs (``out``: written; ``inout``: read and written; ``out*``:
a result whose size depends on the data, allocated by the kernel through the context's
``require_tensor`` and returned through a ``diopiTensorHandle_t*``), then
tensor inputs (``in``, ``in?`` may be NULL, ``in[]`` a list of tensors,
``in?[]`` a list whose entries may be NULL), then scalars (``double``, ``int``,
``bool``, ``ints``).
"""
from __future__ import annotations

from dataclasses import dataclass

FLOATS = ("float32", "float64", "float16", "bfloat16")
INDEX = ("int64", "int32")

TENSOR_KINDS = ("out", "out?", "inout", "out*", "in", "in?")
# out*: the kernel allocates the output (its size depends on the data) through ctx->require_tensor
# in[]: a list of const tensors (diopiTensorList_t); in?[]: the same list, an entry may be NULL (index's
# list of optional index tensors, NULL meaning a full slice)
INPUT_KINDS = ("in", "in?", "in[]", "in?[]")
SCALAR_KINDS = ("double", "int", "bool", "ints")
OUTPUT_KINDS = ("out", "out?", "inout", "out*")

# ``approximate`` of gelu travels as an int: ATen spells it as a string.
GELU_APPROXIMATE = {"none": 0, "tanh": 1}


@dataclass(frozen=True)
class Arg:
    name: str
    kind: str

    @property
    def is_tensor(self) -> bool:
        """One tensor handle (not a list)."""
        return self.kind in TENSOR_KINDS

    @property
    def is_tensor_list(self) -> bool:
        return self.kind in ("in[]", "in?[]")

    @property
    def is_output(self) -> bool:
        return self.kind in OUTPUT_KINDS

    @property
    def is_allocated(self) -> bool:
        """An output the kernel allocates (``out*``): the caller passes no tensor for it."""
        return self.kind == "out*"


@dataclass(frozen=True)
class OpSchema:
    """One operator: its ATen name, C arguments in ABI order and the dtypes it declares."""

    aten: str
    args: tuple[Arg, ...]
    dtypes: tuple[str, ...] = FLOATS
    doc: str = ""

    @property
    def symbol(self) -> str:
        """The exported C name: ``aten::add.Tensor`` -> ``diopi_aten_add_Tensor``."""
        return "diopi_" + self.aten.replace("::", "_").replace(".", "_")

    @property
    def outputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.is_output)

    @property
    def inputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.kind in INPUT_KINDS)

    @property
    def scalars(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if not a.is_tensor and not a.is_tensor_list)


def _op(aten: str, spec: str, dtypes: tuple[str, ...] = FLOATS, doc: str = "") -> OpSchema:
    """``spec``: ``"out:out in:self in:other double:alpha"`` (kind:name, in ABI order)."""
    args = []
    last = 0
    for item in spec.split():
        kind, name = item.split(":")
        if kind not in TENSOR_KINDS + INPUT_KINDS + SCALAR_KINDS:
            raise ValueError(f"{aten}: unknown argument kind {kind!r}")
        rank = 0 if kind in OUTPUT_KINDS else 1 if kind in INPUT_KINDS else 2
        if rank < last:
            raise ValueError(f"{aten}: {name} breaks the order outputs, inputs, scalars")
        last = rank
        args.append(Arg(name, kind))
    return OpSchema(aten, tuple(args), dtypes, doc)


_UNARY = "out:out in:self"
_BINARY = "out:out in:self in:other"

OPS: tuple[OpSchema, ...] = (
    # elementwise, broadcasting like torch
    _op("aten::add.Tensor", _BINARY + " double:alpha", dtypes=FLOATS + INDEX, doc="out = self + alpha * other"),
    _op("aten::sub.Tensor", _BINARY + " double:alpha", dtypes=FLOATS + INDEX, doc="out = self - alpha * other"),
    _op("aten::mul.Tensor", _BINARY, dtypes=FLOATS + INDEX),
    _op("aten::div.Tensor", _BINARY),
    _op("aten::neg", _UNARY),
    _op("aten::exp", _UNARY),
    _op("aten::rsqrt", _UNARY),
    _op("aten::sigmoid", _UNARY),
    _op("aten::silu", _UNARY),
    _op("aten::gelu", _UNARY + " int:approximate", doc="approximate: 0 none (erf), 1 tanh"),
    _op("aten::pow.Tensor_Scalar", _UNARY + " double:exponent"),
    _op("aten::pow.Scalar", "out:out in:exponent double:self",
        doc="out = self ** exponent (a number to tensor powers)"),
    _op("aten::reciprocal", _UNARY),
    _op("aten::sqrt", _UNARY),
    _op("aten::log", _UNARY),
    _op("aten::cos", _UNARY),
    _op("aten::sin", _UNARY),
    _op("aten::addcmul", "out:out in:self in:tensor1 in:tensor2 double:value",
        doc="out = self + value * tensor1 * tensor2 (the optimizer's second moment)"),
    _op("aten::addcdiv", "out:out in:self in:tensor1 in:tensor2 double:value",
        doc="out = self + value * tensor1 / tensor2 (AdamW's update, foreach=False)"),
    _op("aten::lerp.Scalar", "out:out in:self in:end double:weight",
        doc="out = self + weight * (end - self) (AdamW's first moment)"),
    _op("aten::relu", _UNARY, doc="out = max(self, 0); NaN stays NaN"),
    _op("aten::threshold_backward", "out:grad_input in:grad_output in:self double:threshold",
        doc="grad_input = self <= threshold ? 0 : grad_output (relu's backward with threshold 0)"),
    _op("aten::silu_backward", "out:grad_input in:grad_output in:self"),
    _op("aten::gelu_backward", "out:grad_input in:grad_output in:self int:approximate"),
    _op("aten::sigmoid_backward", "out:grad_input in:grad_output in:output"),
    # matrix products
    _op("aten::mm", "out:out in:self in:mat2"),
    _op("aten::bmm", "out:out in:self in:mat2"),
    _op("aten::linear", "out:out in:input in:weight in?:bias", doc="out = input @ weight^T + bias"),
    _op("aten::addmm", "out:out in:self in:mat1 in:mat2 double:beta double:alpha",
        doc="out = beta * self + alpha * mat1 @ mat2, self broadcast to the product's shape; beta 0 ignores "
            "self (NaN included), as torch (nn.Linear with a bias)"),
    # normalisations
    _op("aten::_softmax", "out:out in:self int:dim bool:half_to_float"),
    _op("aten::_softmax_backward_data", "out:grad_input in:grad_output in:output int:dim"),
    _op("aten::_safe_softmax", "out:out in:self int:dim",
        doc="softmax; a slice that is -inf throughout (a fully masked attention row) gives zeros"),
    _op("aten::_log_softmax", "out:out in:self int:dim bool:half_to_float"),
    _op("aten::_log_softmax_backward_data", "out:grad_input in:grad_output in:output int:dim"),
    _op("aten::_fused_rms_norm", "out:out out:rstd in:input in?:weight ints:normalized_shape double:eps",
        doc="rstd keeps the input's leading dims and 1 for each normalised dim"),
    _op("aten::_fused_rms_norm_backward",
        "out:grad_input out?:grad_weight in:grad_out in:input in:rstd in?:weight ints:normalized_shape"),
    _op("ext::rotary_embedding", "out:out in:x in:cos in:sin bool:conj",
        doc="out = x*cos + rotate_half(x)*sin (conj: -sin, the backward); cos/sin broadcast to x"),
    # attention: query/key/value (B, H, S, D); logsumexp (B, H, S) in float32 or the input dtype
    _op("aten::_scaled_dot_product_flash_attention_for_cpu",
        "out:output out:logsumexp in:query in:key in:value bool:is_causal double:scale"),
    _op("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "out:grad_query out:grad_key out:grad_value in:grad_out in:query in:key in:value in:out "
        "in:logsumexp bool:is_causal double:scale"),
    # embedding and loss; indices int64 or int32
    _op("aten::embedding", "out:out in:weight in:indices int:padding_idx"),
    _op("aten::embedding_dense_backward", "out:grad_weight in:grad_output in:indices int:padding_idx "
        "bool:scale_grad_by_freq"),
    _op("aten::nll_loss_forward", "out:output out:total_weight in:self in:target in?:weight int:reduction "
        "int:ignore_index", doc="reduction: 0 none, 1 mean, 2 sum"),
    _op("aten::nll_loss_backward", "out:grad_input in:grad_output in:self in:target in?:weight "
        "in:total_weight int:reduction int:ignore_index"),
    # reductions; an empty dim list reduces every dim
    _op("aten::sum.dim_IntList", "out:out in:self ints:dim bool:keepdim"),
    _op("aten::mean.dim", "out:out in:self ints:dim bool:keepdim"),
    _op("aten::max.dim", "out:values out:indices in:self int:dim bool:keepdim"),
    _op("aten::linalg_vector_norm", "out:out in:self double:ord ints:dim bool:keepdim"),
    # data movement
    _op("aten::slice_backward", "out:out in:grad_output ints:input_sizes int:dim int:start int:end int:step",
        doc="zeros of input_sizes with grad_output at start:end:step along dim (start, end clamped as slicing)"),
    _op("aten::_to_copy", _UNARY, dtypes=FLOATS + INDEX, doc="cast into out's dtype"),
    _op("aten::copy_", "inout:self in:src", dtypes=FLOATS + INDEX, doc="self = src (broadcast, cast)"),
    _op("aten::fill_.Scalar", "inout:self double:value", dtypes=FLOATS + INDEX),
    _op("aten::cat", "out:out in[]:tensors int:dim", dtypes=FLOATS + INDEX,
        doc="the tensors joined along dim; 1-dim empty tensors (size 0) are skipped, as in torch"),
    _op("aten::tril", _UNARY + " int:diagonal", dtypes=FLOATS + INDEX + ("bool",),
        doc="the lower triangle of the last two dims: elements with col - row <= diagonal, zeros elsewhere"),
    _op("aten::where.self", "out:out in:condition in:self in:other", dtypes=FLOATS + INDEX,
        doc="condition (bool, broadcast) ? self : other"),
    _op("aten::clone", _UNARY, dtypes=FLOATS + INDEX, doc="any strides in, out's strides out (contiguous, transpose)"),
    # the cross-entropy's index handling: which targets are in range
    _op("aten::ge.Scalar", "out:out in:self double:other", dtypes=FLOATS + INDEX, doc="out (bool) = self >= other"),
    _op("aten::lt.Scalar", "out:out in:self double:other", dtypes=FLOATS + INDEX, doc="out (bool) = self < other"),
    _op("aten::bitwise_and.Tensor", _BINARY, dtypes=INDEX + ("bool",), doc="out = self & other (broadcast)"),
    _op("aten::gather", "out:out in:self in:index int:dim", dtypes=FLOATS + INDEX,
        doc="out = self's elements at index (int64) along dim; index has self's ndim and fits it elsewhere"),
    _op("aten::index.Tensor", "out:out in:self in?[]:indices", dtypes=FLOATS + INDEX,
        doc="out = self[indices]: int64/int32 index tensors (broadcast together), NULL a full slice; adjacent "
            "indexed dims are replaced in place by the indices' shape, else it leads; negative counts from the end"),
    _op("aten::index_put", "out:out in:self in?[]:indices in:values bool:accumulate", dtypes=FLOATS + INDEX,
        doc="out = self with out[indices] = values (broadcast to self[indices]'s shape), or += when accumulate"),
    _op("aten::clamp", "out:out in:self double:min double:max", dtypes=FLOATS + INDEX,
        doc="out = min(max(self, min), max); an absent bound is -inf/+inf; NaN stays NaN; min > max gives max"),
    _op("aten::nonzero", "out*:out in:self", dtypes=FLOATS + INDEX + ("bool",),
        doc="out (int64, [n, self's ndim], allocated by the kernel through ctx->require_tensor) = the indices of "
            "self's nonzero elements (NaN counts) in row-major order; a boolean mask index is its columns"),
    # factories
    _op("aten::arange.start_step", "out:out double:start double:end double:step", dtypes=FLOATS + INDEX,
        doc="out[i] = start + i * step (computed in double, cast to out's dtype); out has the element count"),
    # optimiser
    _op("ext::adamw", "inout:param inout:exp_avg inout:exp_avg_sq in:grad double:lr double:beta1 "
        "double:beta2 double:weight_decay double:eps int:step bool:maximize",
        dtypes=("float32", "float64"), doc="one decoupled-weight-decay Adam step, as torch.optim.AdamW"),
)

BY_NAME: dict[str, OpSchema] = {op.aten: op for op in OPS}
