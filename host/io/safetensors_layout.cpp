#include "io/safetensors_layout.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <type_traits>

#include "io/untrusted.hpp"

namespace kiln::io {
namespace {

using Json = nlohmann::json;

// The dtypes io/safetensors.cpp maps to torch types, with their sizes.
const std::pair<const char*, size_t> kDtypeSizes[] = {
    {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U8", 1},  {"BOOL", 1}};

std::string known_dtypes() {
  std::string out;
  for (const auto& [code, size] : kDtypeSizes) out += (out.empty() ? "" : ", ") + std::string(code);
  return out;
}

// A header is an object of tensors (objects) whose shapes and offsets are arrays: three levels,
// as safetensors allows; deeper text is refused while it is parsed, before it is built.
constexpr int kMaxDepth = 3;

// A JSON integer as T; nullopt for anything else (fractions, exponents, strings such as "4") or
// a value outside T. The parser keeps integers >= 0 as unsigned, negative ones as signed.
template <class T>
std::optional<T> integer_of(const Json& node) {
  if (node.is_number_unsigned()) {
    const auto v = node.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
    return static_cast<T>(v);
  }
  if constexpr (std::is_signed_v<T>) {
    if (node.is_number_integer()) return static_cast<T>(node.get<int64_t>());
  }
  return std::nullopt;
}

// A value from the header for a message: strings in JSON's quotes, so "4" and 4 differ.
std::string json_text(const Json& node) { return quote_name(node.dump()); }

class HeaderReader {
 public:
  HeaderReader(const std::string& path, uint64_t data_size) : path_(path), data_size_(data_size) {}

  [[noreturn]] void fail(const std::string& why) const { throw BadFileError(path_ + ": " + why); }
  [[noreturn]] void fail(const std::string& tensor, const std::string& why) const {
    fail("tensor " + quote_name(tensor) + ": " + why);
  }

  SafetensorsEntry entry(const std::string& name, const Json& node) const {
    if (!node.is_object()) fail(name, "is not an object of dtype, shape, data_offsets");
    SafetensorsEntry e;
    e.name = name;
    const auto dtype = node.find("dtype");
    if (dtype == node.end()) fail(name, "has no dtype");
    e.dtype = dtype->is_string() ? dtype->get<std::string>() : dtype->dump();
    const size_t element_size = safetensors_element_size(e.dtype);
    if (element_size == 0) {
      fail(name, "dtype " + quote_name(e.dtype) + " is not one of " + known_dtypes());
    }

    const auto shape = node.find("shape");
    if (shape == node.end() || !shape->is_array()) fail(name, "shape is not a list of integers");
    for (const Json& dim : *shape) {
      const std::optional<int64_t> d = integer_of<int64_t>(dim);
      if (!d || *d < 0) {
        fail(name, "shape has " + json_text(dim) + ", not an integer >= 0 below 2^63");
      }
      e.shape.push_back(*d);
    }
    const std::optional<uint64_t> numel = checked_numel(e.shape);
    const std::optional<uint64_t> bytes =
        numel ? checked_mul(*numel, element_size) : std::optional<uint64_t>();
    if (!bytes || *bytes > kMaxCount) {
      fail(name, "shape " + shape_text(e.shape) + " of " + e.dtype +
                     " needs more than 2^63 bytes (overflows 64 bits)");
    }

    const auto offsets = node.find("data_offsets");
    std::vector<std::optional<uint64_t>> range;
    if (offsets != node.end() && offsets->is_array()) {
      for (const Json& offset : *offsets) range.push_back(integer_of<uint64_t>(offset));
    }
    if (range.size() != 2 || !range[0] || !range[1]) {
      fail(name, "data_offsets is not [begin, end], two integers >= 0");
    }
    e.begin = *range[0];
    e.end = *range[1];
    const std::string where =
        "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.end < e.begin) fail(name, where + " end before they begin");
    if (e.end > data_size_) {
      fail(name, where + " run past the " + std::to_string(data_size_) +
                     " bytes of data in the file (truncated?)");
    }
    if (e.end - e.begin != *bytes) {
      fail(name, where + " hold " + std::to_string(e.end - e.begin) + " bytes, but shape " +
                     shape_text(e.shape) + " of " + e.dtype + " needs " + std::to_string(*bytes));
    }
    return e;
  }

  // The ranges, in order, must cover the data exactly: a gap or overlap means the header and
  // the data disagree.
  void check_tiling(std::vector<SafetensorsEntry>& entries) const {
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t covered = 0;
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry& e : entries) {
      if (e.begin < covered) {
        fail(e.name, "bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                         ") overlap those of tensor " + quote_name(previous->name) + " (up to " +
                         std::to_string(covered) + ")");
      }
      if (e.begin > covered) {
        fail(e.name, "starts at byte " + std::to_string(e.begin) +
                         " of the data, but the bytes before it end at " + std::to_string(covered) +
                         " (a gap the header does not describe)");
      }
      covered = e.end;
      previous = &e;
    }
    if (covered != data_size_) {
      fail("the header describes " + std::to_string(covered) +
           " bytes of tensor data, the file holds " + std::to_string(data_size_) +
           " after the header");
    }
  }

 private:
  const std::string& path_;
  uint64_t data_size_;
};

}  // namespace

size_t safetensors_element_size(std::string_view code) {
  for (const auto& [name, size] : kDtypeSizes) {
    if (code == name) return size;
  }
  return 0;
}

SafetensorsLayout read_safetensors_layout(std::istream& in, uint64_t file_size,
                                          const std::string& path) {
  auto fail = [&](const std::string& why) { return BadFileError(path + ": " + why); };
  unsigned char le[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(le), 8)) {
    throw fail("not a safetensors file: " + std::to_string(file_size) +
               " bytes, too short for the 8-byte header length");
  }
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | le[i];
  if (length > file_size - 8) {
    throw fail("truncated: the header claims " + std::to_string(length) + " bytes, the file has " +
               std::to_string(file_size - 8) + " after the length");
  }
  if (length > kMaxSafetensorsHeader) {
    throw fail("header of " + std::to_string(length) + " bytes is over safetensors' limit of " +
               std::to_string(kMaxSafetensorsHeader));
  }
  std::string header(length, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(length))) {
    throw fail("truncated in the header");
  }
  const size_t first = header.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || header[first] != '{') {
    throw fail("header is not a JSON object");
  }
  // A JSON object keeps one value per key: a tensor named twice is caught as it is parsed.
  std::set<std::string> names;
  std::optional<std::string> twice;
  const auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    const bool opens =
        event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    if (opens && depth >= kMaxDepth) {  // the container opened at `depth` is level depth + 1
      throw fail("header nests deeper than safetensors' " + std::to_string(kMaxDepth) + " levels");
    }
    if (event == Json::parse_event_t::key && depth == 1 && !twice &&
        !names.insert(parsed.get<std::string>()).second) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(header, check);
  } catch (const Json::exception& e) {
    throw fail(std::string("header is not JSON: ") + e.what());
  }

  SafetensorsLayout layout;
  layout.data_start = 8 + length;
  const HeaderReader reader(path, file_size - layout.data_start);
  if (twice) reader.fail(*twice, "appears twice in the header");
  for (const auto& [name, node] : root.items()) {
    if (name == "__metadata__") {
      if (!node.is_object()) reader.fail("__metadata__ is not an object");
      for (const auto& [key, value] : node.items()) {
        if (!value.is_string()) reader.fail("__metadata__ " + quote_name(key) + " is not a string");
        layout.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    layout.entries.push_back(reader.entry(name, node));
  }
  reader.check_tiling(layout.entries);
  return layout;
}

}  // namespace kiln::io
