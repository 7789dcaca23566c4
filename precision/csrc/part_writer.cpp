#include "part_writer.h"

#include <ATen/ATen.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <unordered_map>

namespace ditorch_precision {

namespace {

constexpr size_t kAlign = 64;

size_t pad(size_t n) { return (kAlign - n % kAlign) % kAlign; }

// The dtypes part_file names (its _DTYPES).
bool named_dtype(c10::ScalarType d) {
  switch (d) {
    case at::kDouble: case at::kFloat: case at::kHalf: case at::kBFloat16: case at::kComplexFloat:
    case at::kComplexDouble: case at::kLong: case at::kInt: case at::kShort: case at::kChar: case at::kByte:
    case at::kBool: case at::kFloat8_e4m3fn: case at::kFloat8_e5m2:
      return true;
    default:
      return false;
  }
}

struct Closer {
  void operator()(std::FILE* f) const {
    if (f != nullptr) std::fclose(f);
  }
};

}  // namespace

void write_part(const std::string& path, const std::vector<const Record*>& records, const DtypeNames& dtype_name) {
  // Each storage once, numbered in order of first use (as part_file.write_part numbers them).
  std::unordered_map<const void*, int64_t> numbers;
  std::vector<const c10::StorageImpl*> blobs;
  std::vector<std::pair<size_t, size_t>> layout;  // offset, nbytes
  size_t end = 0;
  std::string header = "{\"format\": \"precision-part\", \"storages\": [";
  std::string items;
  std::vector<int64_t> storages;
  for (const Record* r : records) {
    const Payload& p = *r->payload;
    storages.assign(p.tensors.size(), 0);
    for (size_t i = 0; i < p.tensors.size(); ++i) {
      if (!named_dtype(p.tensors[i].scalar_type()))
        throw std::runtime_error("capture: " + path + ": record " + r->key + " holds a tensor of dtype " +
                                 std::string(c10::toString(p.tensors[i].scalar_type())) +
                                 ", which a part file does not name; hook='python' saves it with torch.save");
      const c10::StorageImpl* s = p.tensors[i].storage().unsafeGetStorageImpl();
      auto [it, fresh] = numbers.try_emplace(s->data(), static_cast<int64_t>(blobs.size()));
      if (fresh) {
        blobs.push_back(s);
        layout.emplace_back(end, s->nbytes());
        end += s->nbytes() + pad(s->nbytes());
      }
      storages[i] = it->second;
    }
    if (!items.empty()) items += ", ";
    put_string(items, r->key);
    items += ": ";
    format_payload(items, p, dtype_name, storages);
  }
  for (size_t i = 0; i < layout.size(); ++i) {
    if (i) header += ", ";
    header += '[';
    put_int(header, static_cast<int64_t>(layout[i].first));
    header += ", ";
    put_int(header, static_cast<int64_t>(layout[i].second));
    header += ']';
  }
  header += "], \"items\": {";
  header += items;
  header += "}}";
  header.append(pad(8 + header.size()), ' ');

  std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "wb"));
  auto fail = [&](const char* what) {
    throw std::runtime_error("capture: writing " + path + " failed (" + what + ": " + std::strerror(errno) +
                             "); the capture is incomplete");
  };
  if (!f) fail("open");
  unsigned char length[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));  // little-endian
  static const char zeros[kAlign] = {};
  bool ok = std::fwrite(length, 1, 8, f.get()) == 8 && std::fwrite(header.data(), 1, n, f.get()) == n;
  for (size_t i = 0; ok && i < blobs.size(); ++i) {
    const size_t bytes = layout[i].second;
    ok = (bytes == 0 || std::fwrite(blobs[i]->data(), 1, bytes, f.get()) == bytes) &&
         std::fwrite(zeros, 1, pad(bytes), f.get()) == pad(bytes);
  }
  if (!ok) fail("write");
  if (std::fclose(f.release()) != 0) fail("close");
}

}  // namespace ditorch_precision
