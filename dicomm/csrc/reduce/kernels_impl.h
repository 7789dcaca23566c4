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

// Order of ops in each row follows ReduceOp: sum avg product min max band bor bxor.
template <typename T>
void fill_float(KernelTable& t, int dtype) {
  t.combine[dtype][0] = t.combine[dtype][1] = combine_loop<T, Sum>;
  t.combine[dtype][2] = combine_loop<T, Product>;
  t.combine[dtype][3] = combine_loop<T, Min>;
  t.combine[dtype][4] = combine_loop<T, Max>;
  t.combine_many[dtype][0] = t.combine_many[dtype][1] = combine_many_loop<T, Sum>;
  t.combine_many[dtype][2] = combine_many_loop<T, Product>;
  t.combine_many[dtype][3] = combine_many_loop<T, Min>;
  t.combine_many[dtype][4] = combine_many_loop<T, Max>;
  t.divide[dtype] = divide_loop<T>;
}

// Integers have the arithmetic rows of floats plus the bitwise ones.
template <typename T>
void fill_integer(KernelTable& t, int dtype) {
  fill_float<T>(t, dtype);
  t.combine[dtype][5] = combine_loop<T, Band>;
  t.combine[dtype][6] = combine_loop<T, Bor>;
  t.combine[dtype][7] = combine_loop<T, Bxor>;
  t.combine_many[dtype][5] = combine_many_loop<T, Band>;
  t.combine_many[dtype][6] = combine_many_loop<T, Bor>;
  t.combine_many[dtype][7] = combine_many_loop<T, Bxor>;
}

template <typename Convert>
void fill_half(KernelTable& t, int dtype) {
  t.combine[dtype][0] = t.combine[dtype][1] = combine_half<Convert, Sum>;
  t.combine[dtype][2] = combine_half<Convert, Product>;
  t.combine[dtype][3] = combine_half<Convert, Min>;
  t.combine[dtype][4] = combine_half<Convert, Max>;
  t.combine_many[dtype][0] = t.combine_many[dtype][1] = combine_many_half<Convert, Sum>;
  t.combine_many[dtype][2] = combine_many_half<Convert, Product>;
  t.combine_many[dtype][3] = combine_many_half<Convert, Min>;
  t.combine_many[dtype][4] = combine_many_half<Convert, Max>;
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
  t.combine[9][0] = combine_loop<uint8_t, LogicalOr>;    // sum
  t.combine[9][2] = combine_loop<uint8_t, LogicalAnd>;   // product
  t.combine[9][3] = combine_loop<uint8_t, LogicalAnd>;   // min
  t.combine[9][4] = combine_loop<uint8_t, LogicalOr>;    // max
  t.combine[9][5] = combine_loop<uint8_t, LogicalAnd>;   // band
  t.combine[9][6] = combine_loop<uint8_t, LogicalOr>;    // bor
  t.combine[9][7] = combine_loop<uint8_t, LogicalXor>;   // bxor
  t.combine_many[9][0] = combine_many_loop<uint8_t, LogicalOr>;
  t.combine_many[9][2] = combine_many_loop<uint8_t, LogicalAnd>;
  t.combine_many[9][3] = combine_many_loop<uint8_t, LogicalAnd>;
  t.combine_many[9][4] = combine_many_loop<uint8_t, LogicalOr>;
  t.combine_many[9][5] = combine_many_loop<uint8_t, LogicalAnd>;
  t.combine_many[9][6] = combine_many_loop<uint8_t, LogicalOr>;
  t.combine_many[9][7] = combine_many_loop<uint8_t, LogicalXor>;
  return t;
}

}  // namespace dicomm::reduction::DICOMM_KERNEL_NS
