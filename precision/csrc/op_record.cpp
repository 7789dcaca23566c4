#include "op_record.h"

#include <ATen/core/jit_type.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>

#include <charconv>
#include <cmath>
#include <cstdio>

namespace ditorch_precision {

void Record::clear() {
  op = nullptr;
  module_op.clear();
  module_phase.clear();
  module = nullptr;
  random = -1;
  unwritten = 0;
  reduce_op.clear();
  group.clear();
  inputs.clear();
  arg_metas.clear();
  outputs.clear();
  signature.clear();
  strings.clear();
  stats.clear();
  has_input_stats = false;
  full = saved = false;
  if (payload) payload->clear();  // kept for reuse, as the vectors above
  file.clear();
  key.clear();
}

void DtypeNames::set(c10::ScalarType dtype, std::string name) {
  auto i = static_cast<size_t>(dtype);
  if (names_.size() <= i) names_.resize(i + 1);
  names_[i] = std::move(name);
}

std::string_view DtypeNames::operator()(c10::ScalarType dtype) const {
  auto i = static_cast<size_t>(dtype);
  if (i < names_.size() && !names_[i].empty()) return names_[i];
  return c10::toString(dtype);
}

void put_string(std::string& out, std::string_view s) {
  out += '"';
  bool plain = true;
  for (unsigned char c : s) plain = plain && c != '"' && c != '\\' && c >= 0x20;
  if (plain) {
    out.append(s.data(), s.size());
    out += '"';
    return;
  }
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

// A double as Python's json writes it: the shortest text that reads back the same value, a float
// (1.0, not 1), and NaN/Infinity for the non-finite values.
void put_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "Infinity" : "-Infinity";
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
  if (std::string_view(buf, res.ptr - buf).find_first_of(".e") == std::string_view::npos) out += ".0";
}

void put_int(std::string& out, int64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

// A signature's float: non-finite values as text ("inf"), as signature._value writes them.
void put_arg_double(std::string& out, double v) {
  if (std::isfinite(v))
    put_double(out, v);
  else
    out += std::isnan(v) ? "\"nan\"" : (v > 0 ? "\"inf\"" : "\"-inf\"");
}

c10::TypePtr unwrap_optional(const c10::TypePtr& type) {
  if (type && type->kind() == c10::TypeKind::OptionalType) return type->castRaw<c10::OptionalType>()->getElementType();
  return type;
}

c10::TypePtr element_type(const c10::TypePtr& type) {
  auto t = unwrap_optional(type);
  if (t && t->kind() == c10::TypeKind::ListType) return t->castRaw<c10::ListType>()->getElementType();
  return nullptr;
}

const char* layout_name(int64_t layout) {
  switch (static_cast<c10::Layout>(layout)) {
    case c10::kStrided: return "strided";
    case c10::kSparse: return "sparse_coo";
    case c10::kSparseCsr: return "sparse_csr";
    case c10::kSparseCsc: return "sparse_csc";
    case c10::kSparseBsr: return "sparse_bsr";
    case c10::kSparseBsc: return "sparse_bsc";
    case c10::kMkldnn: return "_mkldnn";
    case c10::kJagged: return "jagged";
    default: return nullptr;
  }
}

const char* memory_format_name(int64_t format) {
  switch (static_cast<c10::MemoryFormat>(format)) {
    case c10::MemoryFormat::Contiguous: return "contiguous_format";
    case c10::MemoryFormat::Preserve: return "preserve_format";
    case c10::MemoryFormat::ChannelsLast: return "channels_last";
    case c10::MemoryFormat::ChannelsLast3d: return "channels_last_3d";
    default: return nullptr;
  }
}

namespace {

struct Writer {
  std::string& out;
  const Record& r;
  const DtypeNames& dtype_name;

  void meta(const Meta& m, bool with_device) {
    out += "{\"shape\": [";
    for (size_t d = 0; d < m.shape.size(); ++d) {
      if (d) out += ", ";
      put_int(out, m.shape[d]);
    }
    out += "], \"dtype\": ";
    put_string(out, dtype_name(m.dtype));
    if (with_device) {
      out += ", \"device\": ";
      if (m.device.is_cpu())
        out += "\"cpu\"";
      else
        put_string(out, m.device.str());
    }
    out += '}';
  }

  void metas(const std::vector<Meta>& ms) {
    for (size_t i = 0; i < ms.size(); ++i) {
      if (i) out += ", ";
      meta(ms[i], true);
    }
  }

  void complex(const Token& t) {
    out += '[';
    put_arg_double(out, t.re);
    out += ", ";
    put_arg_double(out, t.im);
    out += ']';
  }

  // One value as signature._value writes it, from token `at` on; returns the token after it.
  size_t value(size_t at, const c10::TypePtr& type) {
    const Token& t = r.signature[at];
    switch (t.kind) {
      case Token::Int: {
        const auto real = unwrap_optional(type);
        const auto kind = real ? real->kind() : c10::TypeKind::AnyType;
        const char* name = nullptr;
        if (kind == c10::TypeKind::ScalarTypeType) {
          put_string(out, dtype_name(static_cast<c10::ScalarType>(t.i)));
          return at + 1;
        }
        if (kind == c10::TypeKind::LayoutType) name = layout_name(t.i);
        if (kind == c10::TypeKind::MemoryFormatType) name = memory_format_name(t.i);
        if (name != nullptr)
          put_string(out, name);
        else
          put_int(out, t.i);
        return at + 1;
      }
      case Token::Double: put_arg_double(out, t.re); return at + 1;
      case Token::Bool: out += t.i ? "true" : "false"; return at + 1;
      case Token::Complex: complex(t); return at + 1;
      case Token::String: put_string(out, r.strings[t.i]); return at + 1;
      case Token::Tensor: meta(r.arg_metas[t.i], false); return at + 1;
      case Token::Absent: out += "null"; return at + 1;  // an item of a list (an argument is left out)
      case Token::ListBegin: {
        const auto elem = element_type(type);
        out += '[';
        size_t i = at + 1;
        for (bool first = true; r.signature[i].kind != Token::ListEnd; first = false) {
          if (!first) out += ", ";
          i = value(i, elem);
        }
        out += ']';
        return i + 1;
      }
      default: return at + 1;  // Arg, ListEnd: not a value
    }
  }

  void signature() {
    out += "\"signature\": {";
    const auto& sig = r.signature;
    for (size_t i = 0; i < sig.size();) {
      const auto pos = static_cast<size_t>(sig[i].i);
      if (i) out += ", ";
      if (pos < r.op->arg_names.size())
        put_string(out, r.op->arg_names[pos]);
      else
        put_string(out, "arg" + std::to_string(pos));
      out += ": ";
      i = value(i + 1, pos < r.op->arg_types.size() ? r.op->arg_types[pos] : nullptr);
    }
    out += '}';
  }

  // One output's statistics as summaries.tensor_stats writes them.
  void stats(const Meta& m, const OutStats& o) {
    out += "{\"dtype\": ";
    put_string(out, dtype_name(m.dtype));
    out += ", \"numel\": ";
    int64_t numel = 1;
    for (auto d : m.shape) numel *= d;
    put_int(out, numel);
    if (!o.counted) {
      out += '}';
      return;
    }
    const FusedStats& s = o.s;
    out += ", \"nan\": ";
    put_int(out, s.nan);
    out += ", \"inf\": ";
    put_int(out, s.inf);
    if (s.finite > 0) {
      out += ", \"min\": ";
      put_double(out, s.lo);
      out += ", \"max\": ";
      put_double(out, s.hi);
      out += ", \"mean\": ";
      put_double(out, s.sum / static_cast<double>(s.finite));
      out += ", \"norm\": ";
      put_double(out, std::sqrt(s.sumsq));
    }
    out += '}';
  }

  void all_stats() {
    out += "\"stats\": [";
    for (size_t i = 0; i < r.outputs.size(); ++i) {
      if (i) out += ", ";
      stats(r.outputs[i], r.stats[i]);
    }
    out += ']';
    if (r.has_input_stats) {
      out += ", \"input_stats\": ";
      stats(r.input_meta, r.input_stats);
    }
    out += '}';
  }

  // The opening fields, shared by op and module records: index .. "api": null.
  void head(std::string_view op, std::string_view overload, std::string_view phase) {
    out += "{\"index\": ";
    put_int(out, r.index);
    out += ", \"op\": ";
    put_string(out, op);
    out += ", \"overload\": ";
    put_string(out, overload);
    out += ", \"phase\": ";
    put_string(out, phase);
    out += ", \"module\": ";
    if (r.module == nullptr || r.module->empty())
      out += "null";
    else
      put_string(out, *r.module);
    out += ", \"step\": ";
    put_int(out, r.step);
    out += ", \"rank\": ";
    put_int(out, r.rank);
    out += ", \"callsite\": null, \"api\": null";
  }

  // "outputs" and, where some were left unwritten, their count; each field followed by ", ".
  void outputs() {
    out += "\"outputs\": [";
    metas(r.outputs);
    out += "], ";
    if (r.unwritten > 0) {
      out += "\"unwritten\": ";
      put_int(out, r.unwritten);
      out += ", ";
    }
  }

  // A full capture's "file" (and "key"): where the part writer put its tensors; null when none kept.
  void file() {
    out += "\"file\": ";
    if (r.saved && !r.file.empty())
      put_string(out, r.file);
    else
      out += "null";
  }

  void key() {
    if (r.saved && !r.file.empty()) {
      out += ", \"key\": ";
      put_string(out, r.key);
    }
  }

  void op_line() {
    head(r.op->shown_name, r.op->shown_overload, r.phase);
    out += ", \"inputs\": [";
    metas(r.inputs);
    out += "], ";
    if (r.full) {  // no signature (the file holds the arguments), no statistics
      if (r.random >= 0) out += r.random ? "\"random\": true, " : "\"random\": false, ";
      outputs();
      file();
      if (r.op->collective) {
        out += ", ";
        collective();
      }
      key();
      out += '}';
      return;
    }
    file();
    out += ", ";
    signature();
    if (r.random >= 0) out += r.random ? ", \"random\": true" : ", \"random\": false";
    out += ", ";
    outputs();
    if (r.op->collective) {
      collective();
      out += ", ";
    }
    all_stats();
  }

  // A collective's "reduce_op" and "group", as the Python hook writes them: the cross-rank checks read them.
  void collective() {
    out += "\"reduce_op\": ";
    if (r.reduce_op.empty())
      out += "null";
    else
      put_string(out, r.reduce_op);
    out += ", \"group\": ";
    if (r.group.empty()) {
      out += "null";
    } else {
      out += '[';
      for (size_t i = 0; i < r.group.size(); ++i) {
        if (i) out += ", ";
        put_int(out, r.group[i]);
      }
      out += ']';
    }
  }

  void module_line() {
    head(r.module_op, "default", r.module_phase);
    out += ", \"kind\": \"module\", \"inputs\": [], ";
    outputs();
    file();
    if (r.full) {
      key();
      out += '}';
      return;
    }
    out += ", ";
    all_stats();
  }
};

}  // namespace

void format_record(std::string& out, const Record& r, const DtypeNames& dtype_name) {
  Writer w{out, r, dtype_name};
  if (r.op != nullptr)
    w.op_line();
  else
    w.module_line();
}

}  // namespace ditorch_precision
