// Kernel templates shared by the generic and the AVX2 translation units. Each includes this file
// once, after defining DICOMM_KERNEL_NS (a namespace of its own, so the two sets of template
// instances never merge at link time) and a float16 converter `Fp16Convert`.
//
// The loops are plain element-wise code on purpose: GCC vectorises them for whatever instruction
// set the including unit targets.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "reduce/half.h"
#include "reduce/kernel_table.h"

namespace dicomm::reduction::DICOMM_KERNEL_NS {

// Integer arithmetic runs on unsigned types so overflow wraps (as in torch) instead of being UB;
// types narrower than int multiply as unsigned int to stay clear of int promotion overflow.
template <typename T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct Sum {
  template <typename T> static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return a + b;
    else return static_cast<T>(Wide<T>(a) + Wide<T>(b));
  }
};
struct Product {
  template <typename T> static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return a * b;
    else return static_cast<T>(Wide<T>(a) * Wide<T>(b));
  }
};
// NaN wins, like torch.minimum/maximum; on ties (+0 vs -0) the second operand, like x86 minps.
struct Min {
  template <typename T> static T apply(T a, T b) {
    const T r = a < b ? a : b;
    if constexpr (std::is_floating_point_v<T>) return a != a ? a : r;
    else return r;
  }
};
struct Max {
  template <typename T> static T apply(T a, T b) {
    const T r = a > b ? a : b;
    if constexpr (std::is_floating_point_v<T>) return a != a ? a : r;
    else return r;
  }
};
struct Band { template <typename T> static T apply(T a, T b) { return a & b; } };
struct Bor { template <typename T> static T apply(T a, T b) { return a | b; } };
struct Bxor { template <typename T> static T apply(T a, T b) { return a ^ b; } };
// bool: any non-zero byte is true, results are 0 or 1.
struct LogicalAnd {
  static uint8_t apply(uint8_t a, uint8_t b) { return (a != 0) & (b != 0); }
};
struct LogicalOr {
  static uint8_t apply(uint8_t a, uint8_t b) { return (a != 0) | (b != 0); }
};
struct LogicalXor {
  static uint8_t apply(uint8_t a, uint8_t b) { return (a != 0) ^ (b != 0); }
};

template <typename T, typename Op>
void combine_loop(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
}

// Many inputs in one pass: a block of the running result stays in L1 while every input's block is
// folded in, in input order, so each input is read once and the output written once (p - 1 pairwise
// passes read and write the running result p - 2 more times). The output may be any input: a block
// is read whole before it is written.
template <typename T, typename Op>
void combine_many_loop(void* out, const void* const* srcs, int n, size_t count) {
  constexpr size_t kBlock = 4096 / sizeof(T);  // 4 KiB of running result
  T* o = static_cast<T*>(out);
  T acc[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t m = std::min(kBlock, count - start);
    const T* x = static_cast<const T*>(srcs[0]) + start;
    const T* y = static_cast<const T*>(srcs[1]) + start;
    for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(x[i], y[i]);
    for (int q = 2; q < n; ++q) {
      const T* z = static_cast<const T*>(srcs[q]) + start;
      for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], z[i]);
    }
    std::copy(acc, acc + m, o + start);
  }
}

struct Bf16Convert {
  static void to_float(const uint16_t* src, float* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  }
  static void from_float(const float* src, uint16_t* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
  }
};

// 16-bit floats: widen a block of each operand to float32, combine, round back once.
template <typename Convert, typename Op>
void combine_half(void* out, const void* a, const void* b, size_t n) {
  constexpr size_t kBlock = 512;  // 2 x 2 KiB of float32 scratch: stays in L1
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  float fx[kBlock], fy[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t m = std::min(kBlock, n - start);
    Convert::to_float(x + start, fx, m);
    Convert::to_float(y + start, fy, m);
    for (size_t i = 0; i < m; ++i) fx[i] = Op::apply(fx[i], fy[i]);
    Convert::from_float(fx, o + start, m);
  }
}

// 16-bit floats, many inputs: the running result is rounded to 16 bits after every step, as a
// sequence of pairwise combines (and torch's x0 + x1 + ... on 16-bit tensors) rounds it.
template <typename Convert, typename Op>
void combine_many_half(void* out, const void* const* srcs, int n, size_t count) {
  constexpr size_t kBlock = 512;
  uint16_t* o = static_cast<uint16_t*>(out);
  float acc[kBlock], next[kBlock];
  uint16_t rounded[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t m = std::min(kBlock, count - start);
    Convert::to_float(static_cast<const uint16_t*>(srcs[0]) + start, acc, m);
    for (int q = 1; q < n; ++q) {
      Convert::to_float(static_cast<const uint16_t*>(srcs[q]) + start, next, m);
      for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], next[i]);
      Convert::from_float(acc, rounded, m);
      if (q + 1 < n) Convert::to_float(rounded, acc, m);
    }
    std::copy(rounded, rounded + m, o + start);
  }
}

template <typename T>
void divide_loop(void* buf, size_t n, int64_t divisor) {
  T* p = static_cast<T*>(buf);
  if constexpr (std::is_floating_point_v<T>) {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
  } else {
    // int64 division truncates toward zero; the quotient's magnitude never exceeds the input's.
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<int64_t>(p[i]) / divisor);
  }
}

template <typename Convert>
void divide_half(void* buf, size_t n, int64_t divisor) {
  constexpr size_t kBlock = 512;
  uint16_t* p = static_cast<uint16_t*>(buf);
  const float d = static_cast<float>(divisor);
  float f[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t m = std::min(kBlock, n - start);
    Convert::to_float(p + start, f, m);
    for (size_t i = 0; i < m; ++i) f[i] = f[i] / d;
    Convert::from_float(f, p + start, m);
  }
}

// An op's pairwise and many-input kernels are set together, so that the fused and the pairwise all_reduce
// can never apply different ops.
template <typename T, typename Op>
void set_op(KernelTable& t, int dtype, int op) {
  t.combine[dtype][op] = combine_loop<T, Op>;
  t.combine_many[dtype][op] = combine_many_loop<T, Op>;
}

template <typename Convert, typename Op>
void set_half_op(KernelTable& t, int dtype, int op) {
  t.combine[dtype][op] = combine_half<Convert, Op>;
  t.combine_many[dtype][op] = combine_many_half<Convert, Op>;
}

// Order of ops in each row follows ReduceOp: sum avg product min max band bor bxor.
template <typename T>
void fill_float(KernelTable& t, int dtype) {
  set_op<T, Sum>(t, dtype, 0);
  set_op<T, Sum>(t, dtype, 1);
  set_op<T, Product>(t, dtype, 2);
  set_op<T, Min>(t, dtype, 3);
  set_op<T, Max>(t, dtype, 4);
  t.divide[dtype] = divide_loop<T>;
}

// Integers have the arithmetic rows of floats plus the bitwise ones.
template <typename T>
void fill_integer(KernelTable& t, int dtype) {
  fill_float<T>(t, dtype);
  set_op<T, Band>(t, dtype, 5);
  set_op<T, Bor>(t, dtype, 6);
  set_op<T, Bxor>(t, dtype, 7);
}

template <typename Convert>
void fill_half(KernelTable& t, int dtype) {
  set_half_op<Convert, Sum>(t, dtype, 0);
  set_half_op<Convert, Sum>(t, dtype, 1);
  set_half_op<Convert, Product>(t, dtype, 2);
  set_half_op<Convert, Min>(t, dtype, 3);
  set_half_op<Convert, Max>(t, dtype, 4);
  t.divide[dtype] = divide_half<Convert>;
}

// Row indices follow DataType: float32 float64 float16 bfloat16 int8 int16 int32 int64 uint8 bool.
template <typename Fp16Convert>
KernelTable make_table() {
  KernelTable t{};
  fill_float<float>(t, 0);
  fill_float<double>(t, 1);
  fill_half<Fp16Convert>(t, 2);
  fill_half<Bf16Convert>(t, 3);
  fill_integer<int8_t>(t, 4);
  fill_integer<int16_t>(t, 5);
  fill_integer<int32_t>(t, 6);
  fill_integer<int64_t>(t, 7);
  fill_integer<uint8_t>(t, 8);
  set_op<uint8_t, LogicalOr>(t, 9, 0);    // sum
  set_op<uint8_t, LogicalAnd>(t, 9, 2);   // product
  set_op<uint8_t, LogicalAnd>(t, 9, 3);   // min
  set_op<uint8_t, LogicalOr>(t, 9, 4);    // max
  set_op<uint8_t, LogicalAnd>(t, 9, 5);   // band
  set_op<uint8_t, LogicalOr>(t, 9, 6);    // bor
  set_op<uint8_t, LogicalXor>(t, 9, 7);   // bxor
  return t;
}

}  // namespace dicomm::reduction::DICOMM_KERNEL_NS
