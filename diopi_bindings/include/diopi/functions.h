/* Generated from diopi_bindings/schema.py by `python -m diopi_bindings.gen_header`: do not edit. */
#ifndef DIOPI_FUNCTIONS_H_
#define DIOPI_FUNCTIONS_H_

#include "diopirt.h"

/* Weak: a library defines any subset; the framework looks each one up when it loads the library
 * and serves the rest itself. Optional tensors (in?, out?) may be NULL. An out* output's size depends
 * on the data: the kernel allocates it through ctx->require_tensor and stores the handle there. */
#if defined(_WIN32)
#define DIOPI_WEAK
#else
#define DIOPI_WEAK __attribute__((weak))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* aten::add.Tensor [float32, float64, float16, bfloat16, int64, int32] out:out self:in other:in alpha:double
 * out = self + alpha * other */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_add_Tensor(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t other, double alpha);

/* aten::sub.Tensor [float32, float64, float16, bfloat16, int64, int32] out:out self:in other:in alpha:double
 * out = self - alpha * other */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_sub_Tensor(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t other, double alpha);

/* aten::mul.Tensor [float32, float64, float16, bfloat16, int64, int32] out:out self:in other:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_mul_Tensor(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t other);

/* aten::div.Tensor [float32, float64, float16, bfloat16] out:out self:in other:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_div_Tensor(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t other);

/* aten::neg [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_neg(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::exp [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_exp(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::rsqrt [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_rsqrt(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::sigmoid [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_sigmoid(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::silu [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_silu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::gelu [float32, float64, float16, bfloat16] out:out self:in approximate:int
 * approximate: 0 none (erf), 1 tanh */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_gelu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, int64_t approximate);

/* aten::pow.Tensor_Scalar [float32, float64, float16, bfloat16] out:out self:in exponent:double */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_pow_Tensor_Scalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, double exponent);

/* aten::pow.Scalar [float32, float64, float16, bfloat16] out:out exponent:in self:double
 * out = self ** exponent (a number to tensor powers) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_pow_Scalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t exponent, double self);

/* aten::reciprocal [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_reciprocal(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::sqrt [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_sqrt(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::log [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_log(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::cos [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_cos(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::sin [float32, float64, float16, bfloat16] out:out self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_sin(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::addcmul [float32, float64, float16, bfloat16] out:out self:in tensor1:in tensor2:in value:double
 * out = self + value * tensor1 * tensor2 (the optimizer's second moment) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_addcmul(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2, double value);

/* aten::addcdiv [float32, float64, float16, bfloat16] out:out self:in tensor1:in tensor2:in value:double
 * out = self + value * tensor1 / tensor2 (AdamW's update, foreach=False) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_addcdiv(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2, double value);

/* aten::lerp.Scalar [float32, float64, float16, bfloat16] out:out self:in end:in weight:double
 * out = self + weight * (end - self) (AdamW's first moment) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_lerp_Scalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t end, double weight);

/* aten::relu [float32, float64, float16, bfloat16] out:out self:in
 * out = max(self, 0); NaN stays NaN */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_relu(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::threshold_backward [float32, float64, float16, bfloat16] grad_input:out grad_output:in self:in threshold:double
 * grad_input = self <= threshold ? 0 : grad_output (relu's backward with threshold 0) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_threshold_backward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input, diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t self, double threshold);

/* aten::silu_backward [float32, float64, float16, bfloat16] grad_input:out grad_output:in self:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_silu_backward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input, diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t self);

/* aten::gelu_backward [float32, float64, float16, bfloat16] grad_input:out grad_output:in self:in approximate:int */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_gelu_backward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input, diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t self, int64_t approximate);

/* aten::sigmoid_backward [float32, float64, float16, bfloat16] grad_input:out grad_output:in output:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_sigmoid_backward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input, diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output);

/* aten::mm [float32, float64, float16, bfloat16] out:out self:in mat2:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_mm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t mat2);

/* aten::bmm [float32, float64, float16, bfloat16] out:out self:in mat2:in */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_bmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t mat2);

/* aten::linear [float32, float64, float16, bfloat16] out:out input:in weight:in bias:in?
 * out = input @ weight^T + bias */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_linear(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t input, diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias);

/* aten::addmm [float32, float64, float16, bfloat16] out:out self:in mat1:in mat2:in beta:double alpha:double
 * out = beta * self + alpha * mat1 @ mat2, self broadcast to the product's shape; beta 0 ignores self (NaN included), as torch (nn.Linear with a bias) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_addmm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t mat1, diopiConstTensorHandle_t mat2, double beta, double alpha);

/* aten::_softmax [float32, float64, float16, bfloat16] out:out self:in dim:int half_to_float:bool */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__softmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, int64_t dim, bool half_to_float);

/* aten::_softmax_backward_data [float32, float64, float16, bfloat16] grad_input:out grad_output:in output:in dim:int */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__softmax_backward_data(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input, diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output, int64_t dim);

/* aten::_safe_softmax [float32, float64, float16, bfloat16] out:out self:in dim:int
 * softmax; a slice that is -inf throughout (a fully masked attention row) gives zeros */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__safe_softmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, int64_t dim);

/* aten::_log_softmax [float32, float64, float16, bfloat16] out:out self:in dim:int half_to_float:bool */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__log_softmax(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, int64_t dim, bool half_to_float);

/* aten::_log_softmax_backward_data [float32, float64, float16, bfloat16] grad_input:out grad_output:in output:in dim:int */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__log_softmax_backward_data(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input, diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output, int64_t dim);

/* aten::_fused_rms_norm [float32, float64, float16, bfloat16] out:out rstd:out input:in weight:in? normalized_shape:ints eps:double
 * rstd keeps the input's leading dims and 1 for each normalised dim */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__fused_rms_norm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t rstd, diopiConstTensorHandle_t input, diopiConstTensorHandle_t weight, diopiSize_t normalized_shape, double eps);

/* aten::_fused_rms_norm_backward [float32, float64, float16, bfloat16] grad_input:out grad_weight:out? grad_out:in input:in rstd:in weight:in? normalized_shape:ints */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__fused_rms_norm_backward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input, diopiTensorHandle_t grad_weight, diopiConstTensorHandle_t grad_out, diopiConstTensorHandle_t input, diopiConstTensorHandle_t rstd, diopiConstTensorHandle_t weight, diopiSize_t normalized_shape);

/* ext::rotary_embedding [float32, float64, float16, bfloat16] out:out x:in cos:in sin:in conj:bool
 * out = x*cos + rotate_half(x)*sin (conj: -sin, the backward); cos/sin broadcast to x */
DIOPI_API DIOPI_WEAK diopiError_t diopi_ext_rotary_embedding(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t x, diopiConstTensorHandle_t cos, diopiConstTensorHandle_t sin, bool conj);

/* aten::_scaled_dot_product_flash_attention_for_cpu [float32, float64, float16, bfloat16] output:out logsumexp:out query:in key:in value:in is_causal:bool scale:double */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__scaled_dot_product_flash_attention_for_cpu(diopiContextHandle_t ctx, diopiTensorHandle_t output, diopiTensorHandle_t logsumexp, diopiConstTensorHandle_t query, diopiConstTensorHandle_t key, diopiConstTensorHandle_t value, bool is_causal, double scale);

/* aten::_scaled_dot_product_flash_attention_for_cpu_backward [float32, float64, float16, bfloat16] grad_query:out grad_key:out grad_value:out grad_out:in query:in key:in value:in out:in logsumexp:in is_causal:bool scale:double */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__scaled_dot_product_flash_attention_for_cpu_backward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_query, diopiTensorHandle_t grad_key, diopiTensorHandle_t grad_value, diopiConstTensorHandle_t grad_out, diopiConstTensorHandle_t query, diopiConstTensorHandle_t key, diopiConstTensorHandle_t value, diopiConstTensorHandle_t out, diopiConstTensorHandle_t logsumexp, bool is_causal, double scale);

/* aten::embedding [float32, float64, float16, bfloat16] out:out weight:in indices:in padding_idx:int */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_embedding(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t weight, diopiConstTensorHandle_t indices, int64_t padding_idx);

/* aten::embedding_dense_backward [float32, float64, float16, bfloat16] grad_weight:out grad_output:in indices:in padding_idx:int scale_grad_by_freq:bool */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_embedding_dense_backward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_weight, diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t indices, int64_t padding_idx, bool scale_grad_by_freq);

/* aten::nll_loss_forward [float32, float64, float16, bfloat16] output:out total_weight:out self:in target:in weight:in? reduction:int ignore_index:int
 * reduction: 0 none, 1 mean, 2 sum */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_nll_loss_forward(diopiContextHandle_t ctx, diopiTensorHandle_t output, diopiTensorHandle_t total_weight, diopiConstTensorHandle_t self, diopiConstTensorHandle_t target, diopiConstTensorHandle_t weight, int64_t reduction, int64_t ignore_index);

/* aten::nll_loss_backward [float32, float64, float16, bfloat16] grad_input:out grad_output:in self:in target:in weight:in? total_weight:in reduction:int ignore_index:int */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_nll_loss_backward(diopiContextHandle_t ctx, diopiTensorHandle_t grad_input, diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t self, diopiConstTensorHandle_t target, diopiConstTensorHandle_t weight, diopiConstTensorHandle_t total_weight, int64_t reduction, int64_t ignore_index);

/* aten::sum.dim_IntList [float32, float64, float16, bfloat16] out:out self:in dim:ints keepdim:bool */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_sum_dim_IntList(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiSize_t dim, bool keepdim);

/* aten::mean.dim [float32, float64, float16, bfloat16] out:out self:in dim:ints keepdim:bool */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_mean_dim(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiSize_t dim, bool keepdim);

/* aten::max.dim [float32, float64, float16, bfloat16] values:out indices:out self:in dim:int keepdim:bool */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_max_dim(diopiContextHandle_t ctx, diopiTensorHandle_t values, diopiTensorHandle_t indices, diopiConstTensorHandle_t self, int64_t dim, bool keepdim);

/* aten::linalg_vector_norm [float32, float64, float16, bfloat16] out:out self:in ord:double dim:ints keepdim:bool */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_linalg_vector_norm(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, double ord, diopiSize_t dim, bool keepdim);

/* aten::slice_backward [float32, float64, float16, bfloat16] out:out grad_output:in input_sizes:ints dim:int start:int end:int step:int
 * zeros of input_sizes with grad_output at start:end:step along dim (start, end clamped as slicing) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_slice_backward(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t grad_output, diopiSize_t input_sizes, int64_t dim, int64_t start, int64_t end, int64_t step);

/* aten::_to_copy [float32, float64, float16, bfloat16, int64, int32] out:out self:in
 * cast into out's dtype */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten__to_copy(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::copy_ [float32, float64, float16, bfloat16, int64, int32] self:inout src:in
 * self = src (broadcast, cast) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_copy_(diopiContextHandle_t ctx, diopiTensorHandle_t self, diopiConstTensorHandle_t src);

/* aten::fill_.Scalar [float32, float64, float16, bfloat16, int64, int32] self:inout value:double */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_fill__Scalar(diopiContextHandle_t ctx, diopiTensorHandle_t self, double value);

/* aten::cat [float32, float64, float16, bfloat16, int64, int32] out:out tensors:in[] dim:int
 * the tensors joined along dim; 1-dim empty tensors (size 0) are skipped, as in torch */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_cat(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorList_t tensors, int64_t dim);

/* aten::tril [float32, float64, float16, bfloat16, int64, int32, bool] out:out self:in diagonal:int
 * the lower triangle of the last two dims: elements with col - row <= diagonal, zeros elsewhere */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_tril(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, int64_t diagonal);

/* aten::where.self [float32, float64, float16, bfloat16, int64, int32] out:out condition:in self:in other:in
 * condition (bool, broadcast) ? self : other */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_where_self(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t condition, diopiConstTensorHandle_t self, diopiConstTensorHandle_t other);

/* aten::clone [float32, float64, float16, bfloat16, int64, int32] out:out self:in
 * any strides in, out's strides out (contiguous, transpose) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_clone(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self);

/* aten::ge.Scalar [float32, float64, float16, bfloat16, int64, int32] out:out self:in other:double
 * out (bool) = self >= other */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_ge_Scalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, double other);

/* aten::lt.Scalar [float32, float64, float16, bfloat16, int64, int32] out:out self:in other:double
 * out (bool) = self < other */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_lt_Scalar(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, double other);

/* aten::bitwise_and.Tensor [int64, int32, bool] out:out self:in other:in
 * out = self & other (broadcast) */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_bitwise_and_Tensor(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t other);

/* aten::gather [float32, float64, float16, bfloat16, int64, int32] out:out self:in index:in dim:int
 * out = self's elements at index (int64) along dim; index has self's ndim and fits it elsewhere */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_gather(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiConstTensorHandle_t index, int64_t dim);

/* aten::index.Tensor [float32, float64, float16, bfloat16, int64, int32] out:out self:in indices:in?[]
 * out = self[indices]: int64/int32 index tensors (broadcast together), NULL a full slice; adjacent indexed dims are replaced in place by the indices' shape, else it leads; negative counts from the end */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_index_Tensor(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiTensorList_t indices);

/* aten::index_put [float32, float64, float16, bfloat16, int64, int32] out:out self:in indices:in?[] values:in accumulate:bool
 * out = self with out[indices] = values (broadcast to self[indices]'s shape), or += when accumulate */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_index_put(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiTensorList_t indices, diopiConstTensorHandle_t values, bool accumulate);

/* aten::clamp [float32, float64, float16, bfloat16, int64, int32] out:out self:in min:double max:double
 * out = min(max(self, min), max); an absent bound is -inf/+inf; NaN stays NaN; min > max gives max */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_clamp(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiConstTensorHandle_t self, double min, double max);

/* aten::nonzero [float32, float64, float16, bfloat16, int64, int32, bool] out:out* self:in
 * out (int64, [n, self's ndim], allocated by the kernel through ctx->require_tensor) = the indices of self's nonzero elements (NaN counts) in row-major order; a boolean mask index is its columns */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_nonzero(diopiContextHandle_t ctx, diopiTensorHandle_t* out, diopiConstTensorHandle_t self);

/* aten::arange.start_step [float32, float64, float16, bfloat16, int64, int32] out:out start:double end:double step:double
 * out[i] = start + i * step (computed in double, cast to out's dtype); out has the element count */
DIOPI_API DIOPI_WEAK diopiError_t diopi_aten_arange_start_step(diopiContextHandle_t ctx, diopiTensorHandle_t out, double start, double end, double step);

/* ext::adamw [float32, float64] param:inout exp_avg:inout exp_avg_sq:inout grad:in lr:double beta1:double beta2:double weight_decay:double eps:double step:int maximize:bool
 * one decoupled-weight-decay Adam step, as torch.optim.AdamW */
DIOPI_API DIOPI_WEAK diopiError_t diopi_ext_adamw(diopiContextHandle_t ctx, diopiTensorHandle_t param, diopiTensorHandle_t exp_avg, diopiTensorHandle_t exp_avg_sq, diopiConstTensorHandle_t grad, double lr, double beta1, double beta2, double weight_decay, double eps, int64_t step, bool maximize);

#ifdef __cplusplus
}
#endif

#endif /* DIOPI_FUNCTIONS_H_ */
