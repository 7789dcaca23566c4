// One index line of a stats capture as the training thread keeps it: the op's (or module
// record's) facts in binary form, copied out of its arguments and outputs, holding no tensor. Its
// JSON text is written later, off the training thread, by `format_record` (op_record.cpp); the
// text is the one the observer used to build in place.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type_base.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fused_stats.h"
#include "op_payload.h"

namespace ditorch_precision {

// What the observer needs of one op overload, read once from its schema. Never freed while the
// observer lives: queued records point at it.
struct OpFacts {
  std::string name;      // "aten::mm"
  std::string overload;  // "default" for the unnamed overload
  // Decomposed above the Python key (a dispatch mode never sees it, only its parts): where its
  // CompositeImplicitAutograd kernel serves the autograd key of the call's backend, which it does on a
  // backend without a kernel of its own for it (composite_on); an op only autograd handles, everywhere.
  bool implicit = false;       // has a CompositeImplicitAutograd kernel and no CompositeExplicit one
  bool autograd_only = false;  // detach_, set_data, ...: its autograd kernel does all its work
  c10::DispatchKeySet backend_kernels;  // the backends (kBackendKeys) with a kernel of its own for it
  // Has a kernel of its own for an autograd key (a custom op registered for backends only has not:
  // torch's autograd fallback calls its backend kernel with no key excluded).
  bool own_autograd = true;
  bool random = false;     // tagged nondeterministic_seeded
  bool allocator = false;  // empty*: its output is uninitialised memory
  bool counted_only = false;  // profiler::*: numbered, never recorded (as the Python hook does)
  bool same_elements = false;  // a view whose output holds exactly its first argument's elements
  // sum, mean, a norm's row means (kReductions): a stats capture keeps its first argument's statistics
  // too, the magnitude its result is judged at (a sum that cancels to rounding noise is no smaller an error)
  bool reduction = false;
  bool view = false;  // its output aliases an input, which it does not write (opinfo's is_view)
  bool collective = false;     // c10d::*, _c10d_functional::*: its outputs hold the result once it completed
  bool functional = false;     // a functional collective (not its plumbing): complete once wait_tensor ran on it
  bool point_to_point = false;  // c10d::send, recv_: never waited for (gloo counts waits)
  // A c10d op returning only its Work (send, reduce_, gather_ ...), not a receive: its output, as the
  // Python hook records it, is its first argument (what it wrote, or a send's tensors).
  bool first_arg_out = false;
  // Recorded under another name: aten::_reshape_alias, which reshape calls only where no Python
  // dispatch mode is active (under one it calls view): written as view, without its stride.
  std::string shown_name, shown_overload;
  int hidden_arg = -1;
  int dropout_p = -1;      // position of a dropout_p argument (a random op without randomness at 0)
  std::vector<std::string> arg_names;
  std::vector<c10::TypePtr> arg_types;
  std::vector<bool> arg_ignored;  // where or how a result is stored, not what it is
  std::vector<int> written_args;  // positions of the arguments it writes (alias annotation "!")
  // As a Python dispatch mode receives the arguments (full capture): defaults, and where the
  // keyword-only ones start; the returns' types.
  std::vector<std::optional<c10::IValue>> arg_defaults;
  size_t kwarg_only_start = 0;
  std::vector<c10::TypePtr> return_types;
};

// A tensor's metadata as the index writes it.
struct Meta {
  c10::SmallVector<int64_t, 6> shape;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device{c10::kCPU};
};

// One value of an op's signature, flattened: a list is its items between ListBegin and ListEnd;
// an argument starts with Arg (its position in the schema).
struct Token {
  enum Kind : uint8_t { Arg, Int, Double, Bool, Complex, String, Tensor, Absent, ListBegin, ListEnd };
  Kind kind = Absent;
  int64_t i = 0;  // Arg: position; Int; Bool; String: index in Record::strings; Tensor: in Record::arg_metas
  double re = 0, im = 0;  // Double; Complex
};

// One output's statistics: `counted` false where the index writes only dtype and numel.
struct OutStats {
  bool counted = false;
  FusedStats s;
};

struct Record {
  int64_t index = 0;
  const OpFacts* op = nullptr;  // null: a module record (module_op)
  std::string module_op, module_phase;
  const char* phase = "";
  const std::string* module = nullptr;  // an interned path (OpObserver::intern), null for none
  int64_t step = 0, rank = 0;
  int8_t random = -1;  // -1: not a seeded-random op; else whether it drew
  int64_t unwritten = 0;
  std::string reduce_op;  // a collective's ReduceOp name ("SUM"; empty: none)
  std::vector<int64_t> group;  // a collective's group, as global ranks (empty: not known)
  std::vector<Meta> inputs, arg_metas, outputs;
  std::vector<Token> signature;
  std::vector<std::string> strings;
  std::vector<OutStats> stats;  // one per output
  bool has_input_stats = false;  // OpFacts::reduction: its first argument's statistics
  Meta input_meta;
  OutStats input_stats;
  // Full capture: the tensors and arguments (saved false: none kept, past the size cap), and where
  // the writer thread put them (file relative to the capture, key in it).
  bool full = false, saved = false;
  std::unique_ptr<Payload> payload;
  std::string file, key;

  void clear();  // for reuse: sizes 0, capacities kept
};

// Names of the dtypes as the index writes them (torch.float32 -> "float32").
class DtypeNames {
 public:
  void set(c10::ScalarType dtype, std::string name);
  std::string_view operator()(c10::ScalarType dtype) const;

 private:
  std::vector<std::string> names_;
};

// JSON pieces as Python's json writes them (a double: shortest text, a float, NaN/Infinity).
void put_string(std::string& out, std::string_view s);
void put_double(std::string& out, double v);
void put_int(std::string& out, int64_t v);
void put_arg_double(std::string& out, double v);
c10::TypePtr unwrap_optional(const c10::TypePtr& type);
c10::TypePtr element_type(const c10::TypePtr& type);
const char* layout_name(int64_t layout);           // torch's name of a c10::Layout (null: unknown)
const char* memory_format_name(int64_t format);   // and of a c10::MemoryFormat

// Appends the record's index line (no newline) to `out`.
void format_record(std::string& out, const Record& r, const DtypeNames& dtype_name);

}  // namespace ditorch_precision
