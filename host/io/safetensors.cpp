#include "io/safetensors.hpp"

#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "io/write_all.hpp"

namespace kiln::io {
namespace {

// safetensors' dtype codes, read both ways.
const std::pair<const char*, at::ScalarType> kDtypes[] = {
    {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"F64", at::kDouble},
    {"I64", at::kLong},  {"I32", at::kInt},  {"I16", at::kShort},     {"I8", at::kChar},
    {"U8", at::kByte},   {"BOOL", at::kBool}};

const char* dtype_code(at::ScalarType t) {
  for (const auto& [code, dtype] : kDtypes) {
    if (dtype == t) return code;
  }
  throw std::runtime_error(std::string("safetensors: no code for dtype ") + c10::toString(t));
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Writes all of `size` bytes or throws.
void write_or_throw(int fd, const void* data, size_t size, const std::string& path) {
  if (write_all(fd, data, size) < size) {
    throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
  }
}

at::ScalarType dtype_of(const std::string& code, const std::string& path) {
  for (const auto& [name, dtype] : kDtypes) {
    if (code == name) return dtype;
  }
  throw std::runtime_error(path + ": unsupported dtype '" + code + "'");
}

}  // namespace

const at::Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char le[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(le), 8)) {
    throw std::runtime_error(path + ": truncated (no header length)");
  }
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | le[i];
  if (length > file_size - 8) {
    throw std::runtime_error(path + ": truncated (header of " + std::to_string(length) +
                             " bytes in a file of " + std::to_string(file_size) + ")");
  }
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  const uint64_t data_start = 8 + length, data_size = file_size - data_start;

  boost::property_tree::ptree root;
  try {
    std::istringstream text(header);
    boost::property_tree::read_json(text, root);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": header is not JSON: " + e.what());
  }
  SafetensorsFile file;
  struct Entry {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  try {
    for (const auto& [name, node] : root) {
      if (name == "__metadata__") {
        for (const auto& [k, v] : node) file.metadata[k] = v.get_value<std::string>();
        continue;
      }
      Entry e{name, dtype_of(node.get<std::string>("dtype"), path), {}, 0, 0};
      for (const auto& dim : node.get_child("shape"))
        e.shape.push_back(dim.second.get_value<int64_t>());
      std::vector<uint64_t> offsets;
      for (const auto& o : node.get_child("data_offsets"))
        offsets.push_back(o.second.get_value<uint64_t>());
      if (offsets.size() != 2)
        throw std::runtime_error("data_offsets of '" + name + "' is not [begin, end]");
      e.begin = offsets[0];
      e.end = offsets[1];
      entries.push_back(std::move(e));
    }
  } catch (const boost::property_tree::ptree_error& e) {
    throw std::runtime_error(path + ": malformed header: " + e.what());
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (const Entry& e : entries) {
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) throw std::runtime_error(path + ": negative dimension in '" + e.name + "'");
      numel *= d;
    }
    const uint64_t bytes = static_cast<uint64_t>(numel) * c10::elementSize(e.dtype);
    if (e.end < e.begin || e.end - e.begin != bytes || e.end > data_size) {
      throw std::runtime_error(path + ": tensor '" + e.name + "' has byte range [" +
                               std::to_string(e.begin) + ", " + std::to_string(e.end) +
                               ") that does not fit its shape or the file (truncated?)");
    }
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    in.seekg(static_cast<std::streamoff>(data_start + e.begin));
    if (!in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes))) {
      throw std::runtime_error(path + ": truncated in tensor '" + e.name + "'");
    }
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> data;
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += (first ? "" : ",") + json_string(k) + ":" + json_string(v);
      first = false;
    }
    header += "}";
  }
  size_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const size_t bytes = t.numel() * t.element_size();
    std::string shape;
    for (int64_t d = 0; d < t.dim(); ++d) shape += (d ? "," : "") + std::to_string(t.size(d));
    header += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          header.size() > 1 ? "," : "", json_string(name),
                          dtype_code(t.scalar_type()), shape, offset, offset + bytes);
    offset += bytes;
    data.push_back(std::move(t));
  }
  header += "}";
  // The data starts 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(tmp + ": cannot create: " + std::strerror(errno));
  try {
    uint64_t length = header.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(length >> (8 * i));
    write_or_throw(fd, le, 8, tmp);
    write_or_throw(fd, header.data(), header.size(), tmp);
    for (const auto& t : data) {
      write_or_throw(fd, t.data_ptr(), t.numel() * t.element_size(), tmp);
    }
    if (::fsync(fd) != 0) throw std::runtime_error(tmp + ": fsync failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename into place: " + reason);
  }
  // The rename itself must reach the disk.
  const std::string dir = path.find('/') == std::string::npos
                              ? std::string(".")
                              : path.substr(0, path.find_last_of('/'));
  const int dfd = ::open(dir.empty() ? "/" : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace kiln::io
