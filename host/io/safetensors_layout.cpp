#include "io/safetensors_layout.hpp"

#include <algorithm>
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <charconv>
#include <optional>
#include <set>
#include <sstream>

#include "io/untrusted.hpp"

namespace kiln::io {
namespace {

namespace pt = boost::property_tree;

// The dtypes io/safetensors.cpp maps to torch types, with their sizes.
const std::pair<const char*, size_t> kDtypeSizes[] = {
    {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U8", 1},  {"BOOL", 1}};

std::string known_dtypes() {
  std::string out;
  for (const auto& [code, size] : kDtypeSizes) out += (out.empty() ? "" : ", ") + std::string(code);
  return out;
}

// A header is an object of tensors (objects) whose shapes and offsets are arrays: three levels.
// Boost's JSON parser recurses once per level, so deeper text is refused before it is parsed.
constexpr int kMaxDepth = 3;

int nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxDepth) return deepest;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

// The parser keeps numbers as their text, and an array as children with empty keys.
bool is_leaf(const pt::ptree& node) { return node.empty(); }
bool is_array(const pt::ptree& node) {
  return node.data().empty() &&
         std::all_of(node.begin(), node.end(), [](const auto& kid) { return kid.first.empty(); });
}
// An empty {} reads like [] and "": those pass as an empty object.
bool is_object(const pt::ptree& node) {
  return node.data().empty() &&
         std::none_of(node.begin(), node.end(), [](const auto& kid) { return kid.first.empty(); });
}

// A JSON integer's text as T; nullopt for anything else (fractions, exponents, strings of
// letters) or a value outside T.
template <class T>
std::optional<T> integer_of(const pt::ptree& node) {
  if (!is_leaf(node)) return std::nullopt;
  const std::string& text = node.data();
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

class HeaderReader {
 public:
  HeaderReader(const std::string& path, uint64_t data_size) : path_(path), data_size_(data_size) {}

  [[noreturn]] void fail(const std::string& why) const { throw BadFileError(path_ + ": " + why); }
  [[noreturn]] void fail(const std::string& tensor, const std::string& why) const {
    fail("tensor " + quote_name(tensor) + ": " + why);
  }

  SafetensorsEntry entry(const std::string& name, const pt::ptree& node) const {
    if (!is_object(node)) fail(name, "is not an object of dtype, shape, data_offsets");
    SafetensorsEntry e;
    e.name = name;
    const auto dtype = node.get_child_optional("dtype");
    if (!dtype || !is_leaf(*dtype)) fail(name, "has no dtype");
    e.dtype = dtype->data();
    const size_t element_size = safetensors_element_size(e.dtype);
    if (element_size == 0) {
      fail(name, "dtype " + quote_name(e.dtype) + " is not one of " + known_dtypes());
    }

    const auto shape = node.get_child_optional("shape");
    if (!shape || !is_array(*shape)) fail(name, "shape is not a list of integers");
    for (const auto& [unused, dim] : *shape) {
      const std::optional<int64_t> d = integer_of<int64_t>(dim);
      if (!d || *d < 0) {
        fail(name, "shape has " + quote_name(dim.data()) + ", not an integer >= 0 below 2^63");
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

    const auto offsets = node.get_child_optional("data_offsets");
    std::vector<std::optional<uint64_t>> range;
    if (offsets && is_array(*offsets)) {
      for (const auto& [unused, offset] : *offsets) range.push_back(integer_of<uint64_t>(offset));
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
  if (nesting_depth(header) > kMaxDepth) {
    throw fail("header nests deeper than safetensors' " + std::to_string(kMaxDepth) + " levels");
  }
  pt::ptree root;
  try {
    std::istringstream text(header);
    pt::read_json(text, root);
  } catch (const pt::ptree_error& e) {
    throw fail(std::string("header is not JSON: ") + e.what());
  }

  SafetensorsLayout layout;
  layout.data_start = 8 + length;
  const HeaderReader reader(path, file_size - layout.data_start);
  std::set<std::string> names;
  for (const auto& [name, node] : root) {
    if (!names.insert(name).second) reader.fail(name, "appears twice in the header");
    if (name == "__metadata__") {
      if (!is_object(node)) reader.fail("__metadata__ is not an object");
      for (const auto& [key, value] : node) {
        if (!is_leaf(value)) reader.fail("__metadata__ " + quote_name(key) + " is not a string");
        layout.metadata[key] = value.data();
      }
      continue;
    }
    layout.entries.push_back(reader.entry(name, node));
  }
  reader.check_tiling(layout.entries);
  return layout;
}

}  // namespace kiln::io
