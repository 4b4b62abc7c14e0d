#include "common.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kiln::datasets {
namespace {

// What `void* instance` points to: the dataset and the host that makes its statuses.
struct Instance {
  const kiln_host_api* host;
  std::unique_ptr<FixedDataset> data;
};

const Instance& instance_of(void* instance) { return *static_cast<const Instance*>(instance); }

std::string errno_text(int err) { return std::strerror(err); }

void check_index(const FixedDataset& d, int64_t index) {
  if (index < 0 || index >= d.num_samples) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "sample " + std::to_string(index) + " outside [0, " +
                                               std::to_string(d.num_samples) + ")");
  }
}

}  // namespace

void FixedDataset::targets(int64_t /*index*/, float* /*out*/) const {
  invalid("targets: the dataset has one class per sample");
}

void invalid(const std::string& message) { throw Error(KILN_ERR_INVALID_ARGUMENT, message); }
void data_loss(const std::string& message) { throw Error(KILN_ERR_DATA_LOSS, message); }

std::string string_option(const kiln_options* options, const char* name) {
  const kiln_option_value* v = find_option(options, name, KILN_OPT_STRING, "dataset");
  if (v == nullptr) invalid(std::string("option '") + name + "' is missing");
  return v->string_value != nullptr ? v->string_value : "";
}

int64_t int_option(const kiln_options* options, const char* name) {
  const kiln_option_value* v = find_option(options, name, KILN_OPT_INT, "dataset");
  if (v == nullptr) invalid(std::string("option '") + name + "' is missing");
  return v->int_value;
}

std::string join_path(const std::string& root, const std::string& name) {
  if (root.empty() || (!name.empty() && name.front() == '/')) return name;
  return root.back() == '/' ? root + name : root + "/" + name;
}

void require_path(const char* component, const char* option, const std::string& path, bool folder) {
  struct stat st {};
  std::string why;
  if (path.empty()) {
    why = "empty";
  } else if (::stat(path.c_str(), &st) != 0) {
    why = errno_text(errno);
  } else if (folder && !S_ISDIR(st.st_mode)) {
    why = "not a folder";
  } else if (!folder && !S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else if (::access(path.c_str(), R_OK) != 0) {
    why = errno_text(errno);
  } else {
    return;
  }
  invalid(std::string(component) + ": option '" + option + "': " + path + ": " + why);
}

RandomAccessFile::RandomAccessFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) invalid(path + ": cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    invalid(path + ": cannot stat: " + errno_text(err));
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

RandomAccessFile::~RandomAccessFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RandomAccessFile::read(uint64_t offset, void* out, uint64_t length,
                            const std::string& what) const {
  auto* dst = static_cast<char*>(out);
  uint64_t done = 0;
  while (done < length) {
    const ssize_t got = ::pread(fd_, dst + done, length - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      data_loss(path_ + ": " + what + ": read error: " + errno_text(errno));
    }
    if (got == 0) {
      data_loss(path_ + ": " + what + ": truncated: " + std::to_string(done) + " of " +
                std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                " (the file changed since it was opened?)");
    }
    done += static_cast<uint64_t>(got);
  }
}

// The most classes a count taken from the labels may give (2^24: more than any class count in
// use, far fewer than a stray huge label would claim).
constexpr int64_t kMaxInferredClasses = int64_t{1} << 24;

int64_t check_labels(const std::vector<int64_t>& labels, int64_t num_classes,
                     const std::string& file, const char* component) {
  int64_t largest = -1;
  for (size_t i = 0; i < labels.size(); ++i) {
    const int64_t label = labels[i];
    const std::string where = std::string(component) + ": " + file + ": label " +
                              std::to_string(label) + " of sample " + std::to_string(i);
    if (num_classes > 0 && (label < 0 || label >= num_classes)) {
      invalid(where + " is outside [0, " + std::to_string(num_classes) +
              ") (option 'num_classes'; 0 takes the count from the labels)");
    }
    // With the count taken from the labels there is no upper bound to quote.
    if (label < 0) {
      invalid(where + " is negative: labels are class indices 0, 1, 2, ...");
    }
    // A count taken from the data sizes the model's head: a stray 2^63 - 1 is not 2^63 classes
    // (nor an overflow of largest + 1).
    if (num_classes == 0 && label >= kMaxInferredClasses) {
      invalid(where + " would make " + std::to_string(label) +
              " + 1 classes (option 'num_classes' = 0 takes the count from the largest label); "
              "set num_classes if the data really has that many");
    }
    largest = std::max(largest, label);
  }
  return num_classes > 0 ? num_classes : largest + 1;
}

void destroy_slot(void* instance) { delete static_cast<Instance*>(instance); }

kiln_status* create_with(Factory factory, const kiln_host_api* host, const kiln_options* options,
                         const kiln_dataset_open* open, void** out) {
  return KILN_GUARD(host, {
    if (open == nullptr || out == nullptr) invalid("create: NULL argument");
    *out = nullptr;
    if (open->split != KILN_SPLIT_TRAIN && open->split != KILN_SPLIT_VAL) {
      invalid("unknown split " + std::to_string(open->split));
    }
    if (open->struct_size < KILN_SIZE_UP_TO(kiln_dataset_open, seed)) {
      invalid("create: kiln_dataset_open of " + std::to_string(open->struct_size) + " bytes");
    }
    std::unique_ptr<FixedDataset> data = factory(options, *open);
    if (data->num_samples <= 0) invalid("the split holds no samples");
    // A host before 1.10 would train on the labels alone.
    if (data->multi_label && host->abi_minor < 10) {
      invalid("multi-label targets need a Kiln host of ABI 1.10 or later; this one is 1." +
              std::to_string(host->abi_minor));
    }
    *out = new Instance{host, std::move(data)};
  });
}

kiln_status* info_slot(void* instance, kiln_dataset_info* out) {
  const Instance& self = instance_of(instance);
  return KILN_GUARD(self.host, {
    const FixedDataset& d = *self.data;
    // Only the fields inside the host's struct_size (all of 1.7's, for a 1.7 host).
    if (!KILN_HAS_FIELD(out, kiln_dataset_info, class_names)) {
      invalid("info: kiln_dataset_info of " + std::to_string(out->struct_size) + " bytes");
    }
    out->num_samples = d.num_samples;
    out->num_classes = d.num_classes;
    out->channels = d.channels;
    out->reserved = 0;
    out->height = d.height;
    out->width = d.width;
    out->class_names = nullptr;
    if (KILN_HAS_FIELD(out, kiln_dataset_info, reserved2)) {
      out->target_kind = d.multi_label ? KILN_TARGET_MULTI_LABEL : KILN_TARGET_CLASS;
      out->reserved2 = 0;
    }
  });
}

kiln_status* probe_slot(void* instance, int64_t index, kiln_sample_header* out) {
  const Instance& self = instance_of(instance);
  return KILN_GUARD(self.host, {
    const FixedDataset& d = *self.data;
    check_index(d, index);
    out->height = d.height;
    out->width = d.width;
    out->label = d.label(index);
  });
}

kiln_status* decode_slot(void* instance, int64_t index, const kiln_decode_request* request,
                         kiln_decoded_sample* out) {
  const Instance& self = instance_of(instance);
  return KILN_GUARD(self.host, {
    const FixedDataset& d = *self.data;
    check_index(d, index);
    const auto need = static_cast<uint64_t>(d.height * d.width * d.channels);
    if (request->pixels == nullptr || request->capacity < need) {
      invalid("decode: sample " + std::to_string(index) + " needs " + std::to_string(need) +
              " bytes, the buffer holds " + std::to_string(request->capacity));
    }
    d.pixels(index, request->pixels);
    out->height = d.height;
    out->width = d.width;
    out->label = d.label(index);
    out->scale = 1;
    out->reserved = 0;
  });
}

kiln_status* targets_slot(void* instance, int64_t index, float* out, int64_t count) {
  const Instance& self = instance_of(instance);
  return KILN_GUARD(self.host, {
    const FixedDataset& d = *self.data;
    check_index(d, index);
    if (out == nullptr || count != d.num_classes) {
      invalid("targets: a row of " + std::to_string(count) + " values; the dataset has " +
              std::to_string(d.num_classes) + " classes");
    }
    d.targets(index, out);
  });
}

const kiln_capabilities kCapabilities = KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU);

}  // namespace kiln::datasets
