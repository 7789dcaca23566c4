// A full capture's payload of one op (or module record) as the C++ observer keeps it: its
// arguments, split into args and kwargs as a Python dispatch mode receives them, and its outputs,
// flattened into tokens, with the tensors held (the program's own where they cover their storage
// exactly, else compact CPU copies) until the writer thread puts them in a part file. The JSON a
// part file's header holds for it (part_file.write_part's encoding) is written by format_payload.
#pragma once

#include <functional>

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type_base.h>
#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ditorch_precision {

struct OpFacts;
class DtypeNames;

struct PayloadToken {
  enum Kind : uint8_t {
    Int, Double, Bool, Complex, String, None, Tensor, Dtype, TorchName, Device, Unsaved,
    ListBegin, TupleBegin, DictBegin, End, Key
  };
  Kind kind = None;
  int64_t i = 0;  // Int; Bool; Tensor: in Payload::tensors; Dtype: the ScalarType; String, Device, Unsaved: in strings
  double re = 0, im = 0;     // Double; Complex
  std::string_view name;     // Key; TorchName (strings that outlive the payload: schema names, literals)
};

// What an op is about to write: the storages of its written arguments, and copies of what they
// held made before it ran (the guard's copies of tensors records kept uncopied). An input on such
// a storage is kept as one of those copies (the same view) or copied; the op's other inputs are
// as they will stay (kept uncopied where compact: a later write is guarded).
struct Written {
  std::vector<const c10::StorageImpl*> storages;
  std::vector<at::Tensor> copies;
};

struct Payload {
  std::vector<PayloadToken> tokens;
  std::vector<std::string> strings;
  std::vector<at::Tensor> tensors;
  std::vector<bool> program;  // tensors[i] is the program's own tensor (not a copy): guarded, waited for
  int64_t nbytes = 0;         // of the arguments' and outputs' tensors (not the masks): the size cap's count
  // The plain tensor holding a Python wrapper subclass's elements (OpObserver::readable, waited for
  // where it is a functional collective's result), as dump._plain saves it; null: tensors as they are.
  const std::function<at::Tensor(const at::Tensor&)>* readable = nullptr;

  void clear();
  // A tensor as saveable_leaf keeps it: uncopied where it covers its whole CPU storage, else a
  // compact CPU copy; one the op writes (`written`, null: none), its content before the op.
  void tensor(const at::Tensor& t, const Written* written);
  // A mask of unwritten elements (a copy the observer made): held, not counted.
  void mask(const at::Tensor& m);
  void value(const c10::IValue& v, const c10::TypePtr& type, const Written* written);
  // The op's arguments as {"args": (...), "kwargs": {...}, (what parseIValuesToPyArgsKwargs hands a
  // dispatch mode: trailing defaults left out, keyword-only arguments by name unless default)
  void arguments(const OpFacts& op, c10::ArrayRef<c10::IValue> inputs, const Written* written);
  void push(PayloadToken::Kind kind, int64_t i = 0) {
    PayloadToken& t = tokens.emplace_back();
    t.kind = kind;
    t.i = i;
  }
  void key(std::string_view name) {
    push(PayloadToken::Key);
    tokens.back().name = name;
  }
  void begin(PayloadToken::Kind kind) { push(kind); }
  void end() { push(PayloadToken::End); }
};

// Appends the payload's JSON; `storages[i]`: the part file's number of tensors[i]'s storage.
void format_payload(std::string& out, const Payload& p, const DtypeNames& dtype_name,
                    const std::vector<int64_t>& storages);

}  // namespace ditorch_precision
