#include "core/types.h"

#include <array>

namespace dicomm {
namespace {

struct DtypeInfo { DataType type; const char* name; size_t size; };
constexpr std::array<DtypeInfo, 10> kDtypes{{
    {DataType::kFloat32, "float32", 4}, {DataType::kFloat64, "float64", 8},
    {DataType::kFloat16, "float16", 2}, {DataType::kBFloat16, "bfloat16", 2},
    {DataType::kInt8, "int8", 1},       {DataType::kInt16, "int16", 2},
    {DataType::kInt32, "int32", 4},     {DataType::kInt64, "int64", 8},
    {DataType::kUInt8, "uint8", 1},     {DataType::kBool, "bool", 1},
}};

struct OpInfo { ReduceOp op; const char* name; };
constexpr std::array<OpInfo, 8> kOps{{
    {ReduceOp::kSum, "sum"}, {ReduceOp::kAvg, "avg"}, {ReduceOp::kProduct, "product"},
    {ReduceOp::kMin, "min"}, {ReduceOp::kMax, "max"}, {ReduceOp::kBand, "band"},
    {ReduceOp::kBor, "bor"}, {ReduceOp::kBxor, "bxor"},
}};

template <typename Table>
std::string valid_names(const Table& table) {
  std::string out;
  for (const auto& e : table) out += (out.empty() ? "" : ", ") + std::string(e.name);
  return out;
}

}  // namespace

size_t dtype_size(DataType t) { return kDtypes.at(static_cast<size_t>(t)).size; }
const char* dtype_name(DataType t) { return kDtypes.at(static_cast<size_t>(t)).name; }
DataType dtype_from_name(const std::string& name) {
  for (const auto& e : kDtypes) if (name == e.name) return e.type;
  throw ValueError("unknown dtype '" + name + "'; expected one of: " + valid_names(kDtypes));
}

const char* reduce_op_name(ReduceOp op) { return kOps.at(static_cast<size_t>(op)).name; }
ReduceOp reduce_op_from_name(const std::string& name) {
  for (const auto& e : kOps) if (name == e.name) return e.op;
  throw ValueError("unknown reduce op '" + name + "'; expected one of: " + valid_names(kOps));
}

}  // namespace dicomm
