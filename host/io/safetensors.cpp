#include "io/safetensors.hpp"

#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/safetensors_layout.hpp"
#include "io/untrusted.hpp"
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
  throw BadFileError(path + ": unsupported dtype " + quote_name(code));
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
  if (!in) throw BadFileError(path + ": cannot open: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) throw BadFileError(path + ": cannot read its size");
  in.seekg(0);
  // Every size below is checked against the file before anything is allocated.
  const SafetensorsLayout layout = read_safetensors_layout(in, static_cast<uint64_t>(end), path);
  SafetensorsFile file;
  file.metadata = layout.metadata;
  for (const SafetensorsEntry& e : layout.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(dtype_of(e.dtype, path)));
    in.seekg(static_cast<std::streamoff>(layout.data_start + e.begin));
    if (!in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin))) {
      throw BadFileError(path + ": truncated in tensor " + quote_name(e.name));
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
  // Names and metadata escaped by nlohmann-json; text that is not UTF-8 throws (no reader
  // could take it).
  if (!metadata.empty()) header += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  size_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const size_t bytes = t.numel() * t.element_size();
    std::string shape;
    for (int64_t d = 0; d < t.dim(); ++d) shape += (d ? "," : "") + std::to_string(t.size(d));
    header += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          header.size() > 1 ? "," : "", nlohmann::json(name).dump(),
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
