// The own-ABI library's operators (diopi_aten_<name>, diopi_bindings/schema.py) routed in C++ on the diopi device:
// each ATen overload the library serves gets a boxed kernel made from a plan that Python resolves once, at set-up
// (diopi_bindings/device/native_router.py: which schema operator, in which form, each ABI argument from which ATen
// argument). Per call: result shapes from the meta kernel, outputs on the device, the library's function through
// the generated trampoline (own_calls.gen.cpp), and the CPU fallback (cpu_fallback.h) for a call the library
// declines or cannot take, logged once per overload and counted.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace diopi_bindings {

// How an ATen overload reaches its schema operator.
enum class OwnForm { kFunctional, kInplace, kOut };

// The value a scalar takes when the ATen overload leaves it None or lacks it.
enum class OwnDefault {
  kNone,        // None: [] for ints, false for a bool; an error for an int or a double
  kZero,        // 0.0 (zero_ is fill_ with 0)
  kDtypeEps,    // torch.finfo(source's dtype).eps (_fused_rms_norm's eps)
  kRsqrtLast,   // 1 / sqrt(source.shape[-1]) (the attention's scale)
  kMinusInf,    // clamp without a lower bound
  kPlusInf,     // clamp without an upper bound
};

// An ABI argument's kind (diopi_bindings/schema.py's): out, out?, inout, out*, in, in?, in[], in?[], double, int,
// bool, ints.
enum class OwnKind { kOut, kOutOptional, kInout, kOutAllocated, kIn, kInOptional, kInList, kInOptionalList, kDouble,
                     kInt, kBool, kInts };

struct OwnRouteArg {
  OwnKind kind = OwnKind::kIn;
  int aten = -1;     // the ATen argument that carries it; -1: the overload has none
  OwnDefault fallback = OwnDefault::kNone;
  int source = -1;   // the ATen tensor a default derives from
};

struct OwnRoute {
  std::string overload;    // "aten::add.out": the ATen overload the kernel serves
  std::string counted_as;  // the name its calls are counted and logged under ("aten::fill_.Scalar" for zero_)
  size_t call = 0;         // the schema operator: an index into kOwnCalls
  uintptr_t function = 0;  // the library's function
  OwnForm form = OwnForm::kFunctional;
  bool masked_select = false;    // masked_select: index by the mask, both broadcast (no operator of its own)
  std::vector<OwnRouteArg> args;  // in ABI order
  std::vector<int> targets;       // the ATen arguments written: out= tensors, or self in place
  int mask_indices = -1;  // an index list in which a boolean mask stands for its nonzero columns
  int mask_base = -1;     // the tensor those indices index
  bool nonzero = false;   // whether the library's nonzero serves those masks
  int dropout = -1;       // the attention's dropout_p and attn_mask: the ABI carries neither
  int attn_mask = -1;
};

// Registers a kernel per route on PrivateUse1 (replacing none); returns a handle for drop_own_routes. `last_error`
// is the library's diopi_last_error; `log(overload, reason)` is called the first time an overload falls back
// (reason empty: the library lacks it).
int64_t register_own_routes(const std::vector<OwnRoute>& routes, uintptr_t last_error,
                            std::function<void(const std::string&, const std::string&)> log);
void drop_own_routes(int64_t handle);

std::vector<std::pair<std::string, int64_t>> own_routed_counts();    // overload -> calls the library served
std::vector<std::pair<std::string, int64_t>> own_fallback_counts();  // overload -> calls run on the CPU
int64_t own_operand_copies();  // CPU tensors (a 0-dim one, say) moved to the device for a call

}  // namespace diopi_bindings
