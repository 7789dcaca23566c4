#include "op_payload.h"

#include <ATen/ATen.h>
#include <ATen/core/jit_type.h>

#include <cstdio>

#include "op_record.h"

namespace ditorch_precision {

namespace {

bool is_kind(const c10::TypePtr& type, c10::TypeKind kind) {
  const auto real = unwrap_optional(type);
  return real && real->kind() == kind;
}

// As dump._compact: saving it writes its whole storage, which holds exactly its elements.
bool compact(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == c10::kStrided && t.has_storage() && t.storage_offset() == 0 &&
         t.storage().nbytes() == static_cast<size_t>(t.numel()) * t.element_size() && !t.is_conj() && !t.is_neg();
}

}  // namespace

void Payload::clear() {
  tokens.clear();
  strings.clear();
  tensors.clear();
  program.clear();
  nbytes = 0;
}

void Payload::tensor(const at::Tensor& t, const Written* written) {
  push(PayloadToken::Tensor, static_cast<int64_t>(tensors.size()));
  nbytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  bool writes = false;
  if (written != nullptr && t.has_storage()) {
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    for (const auto* w : written->storages) writes = writes || w == s;
  }
  if (writes) {  // a copy the guard made of the same elements, before the op: taken, not made again
    for (const at::Tensor& c : written->copies) {
      if (c.scalar_type() == t.scalar_type() && c.storage_offset() == t.storage_offset() && c.sizes() == t.sizes() &&
          c.strides() == t.strides() && c.is_contiguous() && !t.is_conj() && !t.is_neg()) {
        tensors.push_back(c);
        program.push_back(false);
        return;
      }
    }
  } else if (compact(t)) {
    // Its own TensorImpl on the same storage: the program's tensor is not referenced (autograd
    // takes over a gradient only it holds) and no op is dispatched.
    tensors.push_back(t.variable_data());
    program.push_back(true);
    return;
  }
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  if (c.is_alias_of(t)) c = c.clone(at::MemoryFormat::Contiguous);
  if (c.is_conj()) c = c.resolve_conj();
  if (c.is_neg()) c = c.resolve_neg();
  tensors.push_back(std::move(c));
  program.push_back(false);
}

void Payload::mask(const at::Tensor& m) {
  push(PayloadToken::Tensor, static_cast<int64_t>(tensors.size()));
  tensors.push_back(m.device().is_cpu() ? m.contiguous() : m.to(at::kCPU).contiguous());
  program.push_back(false);
}

// As torch::jit::toPyObject, with the schema's type for dtypes, layouts and memory formats
// (parseIValuesToPyArgsKwargs), then dump._encode and part_file's encoding.
void Payload::value(const c10::IValue& v, const c10::TypePtr& type, const Written* written) {
  PayloadToken tok;
  if (v.isNone()) {
    tok.kind = PayloadToken::None;
  } else if (v.isInt() && is_kind(type, c10::TypeKind::ScalarTypeType)) {
    tok.kind = PayloadToken::Dtype;
    tok.i = v.toInt();
  } else if (v.isInt() && (is_kind(type, c10::TypeKind::LayoutType) || is_kind(type, c10::TypeKind::MemoryFormatType))) {
    const char* name = is_kind(type, c10::TypeKind::LayoutType) ? layout_name(v.toInt()) : memory_format_name(v.toInt());
    if (name == nullptr) {
      tok.kind = PayloadToken::Int;
      tok.i = v.toInt();
    } else {
      tok.kind = PayloadToken::TorchName;
      tok.name = name;
    }
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      tok.kind = PayloadToken::None;
    } else if (t.unsafeGetTensorImpl()->is_wrapped_number()) {  // a Python number, handed over as one
      switch (t.scalar_type()) {
        case at::kLong: tok.kind = PayloadToken::Int; tok.i = *t.const_data_ptr<int64_t>(); break;
        case at::kDouble: tok.kind = PayloadToken::Double; tok.re = *t.const_data_ptr<double>(); break;
        case at::kBool: tok.kind = PayloadToken::Bool; tok.i = *t.const_data_ptr<bool>(); break;
        case at::kComplexDouble: {
          const auto c = *t.const_data_ptr<c10::complex<double>>();
          tok.kind = PayloadToken::Complex;
          tok.re = c.real();
          tok.im = c.imag();
          break;
        }
        default: tensor(t, written); return;
      }
    } else if (readable != nullptr && t.key_set().has(c10::DispatchKey::Python)) {
      tensor((*readable)(t), written);
      return;
    } else {
      tensor(t, written);
      return;
    }
  } else if (v.isBool()) {
    tok.kind = PayloadToken::Bool;
    tok.i = v.toBool();
  } else if (v.isInt() || v.isSymInt()) {
    tok.kind = PayloadToken::Int;
    tok.i = v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
  } else if (v.isDouble()) {
    tok.kind = PayloadToken::Double;
    tok.re = v.toDouble();
  } else if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    tok.kind = PayloadToken::Complex;
    tok.re = c.real();
    tok.im = c.imag();
  } else if (v.isString()) {
    tok.kind = PayloadToken::String;
    tok.i = static_cast<int64_t>(strings.size());
    strings.emplace_back(v.toStringRef());
  } else if (v.isDevice()) {
    tok.kind = PayloadToken::Device;
    tok.i = static_cast<int64_t>(strings.size());
    strings.push_back(v.toDevice().str());
  } else if (v.isList()) {
    const auto elem = element_type(type);
    begin(PayloadToken::ListBegin);
    for (const c10::IValue& x : v.toListRef()) value(x, elem, written);
    end();
    return;
  } else if (v.isTuple()) {
    begin(PayloadToken::TupleBegin);
    for (const c10::IValue& x : v.toTupleRef().elements()) value(x, nullptr, written);
    end();
    return;
  } else {  // a generator, a script object: replaying the op refuses it (dump.Unsaved)
    tok.kind = PayloadToken::Unsaved;
    tok.i = static_cast<int64_t>(strings.size());
    if (v.isGenerator()) {  // as Python's repr names it (the address: its C++ object's)
      char text[64];
      std::snprintf(text, sizeof text, "<torch._C.Generator object at %p>",
                    static_cast<const void*>(v.toGenerator().unsafeGetGeneratorImpl()));
      strings.emplace_back(text);
    } else {
      strings.push_back("<" + v.tagKind() + ">");
    }
  }
  tokens.push_back(tok);
}

void Payload::arguments(const OpFacts& op, c10::ArrayRef<c10::IValue> inputs, const Written* written) {
  const size_t n = inputs.size();
  auto is_default = [&](size_t i) {
    if (i >= op.arg_defaults.size() || !op.arg_defaults[i].has_value()) return false;
    const c10::IValue& d = *op.arg_defaults[i];
    const c10::IValue& v = inputs[i];
    if (d.isTensor() || v.isTensor()) return d.isNone() == v.isNone() && d.isNone();  // a tensor's default is None
    return d == v;
  };
  const size_t kw = std::min(op.kwarg_only_start, n);
  size_t positional = kw;
  while (positional > 0 && is_default(positional - 1)) --positional;
  auto type = [&](size_t i) { return i < op.arg_types.size() ? op.arg_types[i] : c10::TypePtr(); };
  begin(PayloadToken::DictBegin);
  key("args");
  begin(PayloadToken::TupleBegin);
  for (size_t i = 0; i < positional; ++i)
    if (static_cast<int>(i) != op.hidden_arg) value(inputs[i], type(i), written);  // as the op it is shown as
  end();
  key("kwargs");
  begin(PayloadToken::DictBegin);
  for (size_t i = kw; i < n; ++i) {
    if (is_default(i)) continue;
    key(op.arg_names[i]);
    value(inputs[i], type(i), written);
  }
  end();
}

namespace {

struct Formatter {
  std::string& out;
  const Payload& p;
  const DtypeNames& dtype_name;
  const std::vector<int64_t>& storages;

  void tag(std::string_view kind) {
    out += "{\"__precision__\": ";
    put_string(out, kind);
  }

  // A tagged object holding one string field: {"__precision__": kind, "<field>": text}.
  void tagged_string(std::string_view kind, std::string_view field, std::string_view text) {
    tag(kind);
    out += ", \"";
    out += field;
    out += "\": ";
    put_string(out, text);
    out += '}';
  }

  void dims(c10::IntArrayRef v) {
    out += '[';
    for (size_t d = 0; d < v.size(); ++d) {
      if (d) out += ", ";
      put_int(out, v[d]);
    }
    out += ']';
  }

  // From token `at`, one value; returns the token after it.
  size_t value(size_t at) {
    const PayloadToken& t = p.tokens[at];
    switch (t.kind) {
      case PayloadToken::Int: put_int(out, t.i); break;
      case PayloadToken::Double: put_double(out, t.re); break;
      case PayloadToken::Bool: out += t.i ? "true" : "false"; break;
      case PayloadToken::None: out += "null"; break;
      case PayloadToken::String: put_string(out, p.strings[t.i]); break;
      case PayloadToken::Complex:
        tag("complex");
        out += ", \"re\": ";
        put_double(out, t.re);
        out += ", \"im\": ";
        put_double(out, t.im);
        out += '}';
        break;
      case PayloadToken::Dtype:
        tagged_string("dtype", "name", dtype_name(static_cast<c10::ScalarType>(t.i)));
        break;
      case PayloadToken::TorchName:
        tagged_string("torch", "name", t.name);
        break;
      case PayloadToken::Device:
        tagged_string("device", "name", p.strings[t.i]);
        break;
      case PayloadToken::Unsaved:
        tagged_string("unsaved", "text", p.strings[t.i]);
        break;
      case PayloadToken::Tensor: {
        const at::Tensor& x = p.tensors[t.i];
        tag("tensor");
        out += ", \"storage\": ";
        put_int(out, storages[t.i]);
        out += ", \"dtype\": ";
        put_string(out, dtype_name(x.scalar_type()));
        out += ", \"view\": [";
        dims(x.sizes());
        out += ", ";
        dims(x.strides());
        out += ", ";
        put_int(out, x.storage_offset());
        out += "]}";
        break;
      }
      case PayloadToken::ListBegin:
      case PayloadToken::TupleBegin: {
        const bool tuple = t.kind == PayloadToken::TupleBegin;
        if (tuple) {
          tag("tuple");
          out += ", \"items\": ";
        }
        out += '[';
        size_t i = at + 1;
        for (bool first = true; p.tokens[i].kind != PayloadToken::End; first = false) {
          if (!first) out += ", ";
          i = value(i);
        }
        out += tuple ? "]}" : "]";
        return i + 1;
      }
      case PayloadToken::DictBegin: {
        out += '{';
        size_t i = at + 1;
        for (bool first = true; p.tokens[i].kind != PayloadToken::End; first = false) {
          if (!first) out += ", ";
          put_string(out, p.tokens[i].name);  // a Key
          out += ": ";
          i = value(i + 1);
        }
        out += '}';
        return i + 1;
      }
      case PayloadToken::End:
      case PayloadToken::Key: break;  // not values
    }
    return at + 1;
  }
};

}  // namespace

void format_payload(std::string& out, const Payload& p, const DtypeNames& dtype_name,
                    const std::vector<int64_t>& storages) {
  Formatter f{out, p, dtype_name, storages};
  if (!p.tokens.empty()) f.value(0);
}

}  // namespace ditorch_precision
