// The host's side of a dataset component, for the fuzz targets of the built-in datasets
// (plugins/dataset/formats), which call its slots as the host's adapter does: a kiln_host_api
// whose statuses keep their code, options as the host passes them, and one instance's calls,
// each checked against what kiln/dataset.h promises. A slot's status other than the one its
// caller allows is a finding: an exception other than kiln::Error reaches the host as
// KILN_ERR_INTERNAL (KILN_ERR_OUT_OF_MEMORY for bad_alloc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_finding.hpp"
#include "kiln/dataset.h"
#include "kiln/plugin.h"

// Opaque to plugins; the host defines it.
struct kiln_status {
  int32_t code;
  std::string message;
};

namespace kiln::fuzz {

inline kiln_status* make_fuzz_status(int32_t code, const char* message) {
  return new kiln_status{code, message != nullptr ? message : ""};
}

inline const kiln_host_api* dataset_host() {
  static const kiln_host_api host = [] {
    kiln_host_api h{};
    h.struct_size = sizeof h;
    h.abi_major = KILN_ABI_MAJOR;
    h.abi_minor = KILN_ABI_MINOR;
    h.make_status = make_fuzz_status;
    return h;
  }();
  return &host;
}

// Options as the host passes them after validation: every option of the schema, by value.
class Options {
 public:
  void string(const char* name, const std::string& value) { entries_.push_back({name, value, 0}); }
  void integer(const char* name, int64_t value) { entries_.push_back({name, "", value, true}); }

  // Valid until the next string() or integer().
  const kiln_options* get() {
    values_.clear();
    for (const Entry& e : entries_) {
      kiln_option_value v{};
      v.struct_size = sizeof v;
      v.name = e.name;
      v.type = e.is_int ? KILN_OPT_INT : KILN_OPT_STRING;
      v.int_value = e.int_value;
      v.string_value = e.is_int ? nullptr : e.string_value.c_str();
      values_.push_back(v);
    }
    options_ = kiln_options{sizeof(kiln_options), values_.size(), values_.data()};
    return &options_;
  }

 private:
  struct Entry {
    const char* name;
    std::string string_value;
    int64_t int_value = 0;
    bool is_int = false;
  };
  std::vector<Entry> entries_;
  std::vector<kiln_option_value> values_;
  kiln_options options_{};
};

// One instance of a dataset component, created through its vtable and destroyed with this.
class Dataset {
 public:
  Dataset(const char* target, const kiln_component_descriptor& component)
      : target_(target), vt_(*static_cast<const kiln_dataset_vtable*>(component.vtable)) {}
  ~Dataset() {
    if (instance_ != nullptr) vt_.destroy(instance_);
  }
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  // create's status: KILN_OK, or the code of a refusal (INVALID_ARGUMENT or DATA_LOSS).
  int32_t create(const kiln_options* options, int32_t split) {
    kiln_dataset_open open{};
    open.struct_size = sizeof open;
    open.split = split;
    void* out = reinterpret_cast<void*>(1);  // create must clear it when it refuses
    const int32_t code = take(vt_.create(dataset_host(), options, &open, &out), "create",
                              KILN_ERR_INVALID_ARGUMENT, KILN_ERR_DATA_LOSS);
    if (code != KILN_OK && out != nullptr) fail("create refused but left *out set");
    if (code == KILN_OK && out == nullptr) fail("create succeeded without an instance");
    instance_ = out;
    return code;
  }

  // info, which must succeed and hold what the header promises.
  kiln_dataset_info info() {
    kiln_dataset_info out{};
    out.struct_size = sizeof out;
    take(vt_.info(instance_, &out), "info");
    if (out.num_samples <= 0 || out.num_classes <= 0 || out.channels <= 0 || out.height <= 0 ||
        out.width <= 0 || out.reserved != 0 || out.reserved2 != 0 ||
        (out.target_kind != KILN_TARGET_CLASS && out.target_kind != KILN_TARGET_MULTI_LABEL)) {
      fail("info broke its promises: " + std::to_string(out.num_samples) + " samples, " +
           std::to_string(out.num_classes) + " classes, " + std::to_string(out.height) + " x " +
           std::to_string(out.width) + " x " + std::to_string(out.channels));
    }
    info_ = out;
    return out;
  }

  // Sample `index` (inside the info's range): its label, and its pixels and target row unless
  // a file read fails (DATA_LOSS: `*ok` false). Checks the refusals around it too: indices
  // outside the range, a buffer a byte too small (left untouched), a row too short.
  int64_t sample(int64_t index, std::vector<uint8_t>* pixels, std::vector<float>* row, bool* ok) {
    const kiln_dataset_info& i = info_;
    kiln_sample_header header{};
    header.struct_size = sizeof header;
    take(vt_.probe(instance_, index, &header), "probe");
    if (header.height != i.height || header.width != i.width || header.label < 0 ||
        header.label >= i.num_classes) {
      fail("probe of sample " + std::to_string(index) + " gave label " +
           std::to_string(header.label) + " of " + std::to_string(i.num_classes));
    }
    for (const int64_t outside : {int64_t{-1}, i.num_samples}) {
      kiln_sample_header h{};
      h.struct_size = sizeof h;
      take(vt_.probe(instance_, outside, &h), "probe (outside)", KILN_ERR_INVALID_ARGUMENT, -1,
           true);
    }

    const auto need = static_cast<size_t>(i.height * i.width * i.channels);
    std::vector<uint8_t> small(need - 1, 0xA5);
    kiln_decode_request request{};
    request.struct_size = sizeof request;
    request.scale_denom = 1;
    request.pixels = small.data();
    request.capacity = small.size();
    kiln_decoded_sample decoded{};
    decoded.struct_size = sizeof decoded;
    take(vt_.decode(instance_, index, &request, &decoded), "decode (too small)",
         KILN_ERR_INVALID_ARGUMENT, -1, true);
    for (const uint8_t b : small) {
      if (b != 0xA5) fail("decode wrote into a buffer it refused");
    }

    pixels->assign(need, 0);
    request.pixels = pixels->data();
    request.capacity = pixels->size();
    request.scale_denom = 8;  // the formats store pixels: they decode at full scale
    *ok = take(vt_.decode(instance_, index, &request, &decoded), "decode", KILN_ERR_DATA_LOSS) ==
          KILN_OK;
    if (*ok && (decoded.height != i.height || decoded.width != i.width || decoded.scale != 1 ||
                decoded.label != header.label || decoded.reserved != 0)) {
      fail("decode of sample " + std::to_string(index) + " disagrees with probe and info");
    }

    // A multi-label row has num_classes floats. One class per sample takes num_classes from the
    // labels (up to 2^63): targets must refuse before it writes, so a shorter row serves there
    // (AddressSanitizer sees a write past it).
    const bool multi = i.target_kind == KILN_TARGET_MULTI_LABEL;
    row->assign(static_cast<size_t>(multi ? i.num_classes : std::min<int64_t>(i.num_classes, 64)),
                -1.0F);
    take(vt_.targets(instance_, index, row->data(), i.num_classes - 1), "targets (too short)",
         KILN_ERR_INVALID_ARGUMENT, -1, true);
    const int32_t code = take(vt_.targets(instance_, index, row->data(), i.num_classes), "targets",
                              KILN_ERR_INVALID_ARGUMENT, KILN_ERR_DATA_LOSS);
    if (!multi) {
      if (code != KILN_ERR_INVALID_ARGUMENT) fail("targets of a one-class-per-sample dataset");
      row->clear();
    } else if (code == KILN_OK) {
      for (const float v : *row) {
        if (!(v >= 0.0F && v <= 1.0F)) fail("a target of " + std::to_string(v));
      }
    } else if (code != KILN_ERR_DATA_LOSS) {
      fail("targets refused a multi-label sample");
    }
    return header.label;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { finding(target_, what); }

  // The code of `status` (KILN_OK for NULL), freed. Codes other than KILN_OK, `allowed` and
  // `also` are findings; with `must_fail`, so is KILN_OK.
  int32_t take(kiln_status* status, const char* call, int32_t allowed = -1, int32_t also = -1,
               bool must_fail = false) const {
    const int32_t code = status == nullptr ? KILN_OK : status->code;
    const std::string message = status == nullptr ? "" : status->message;
    delete status;
    if ((code == KILN_OK && must_fail) || (code != KILN_OK && code != allowed && code != also)) {
      fail(std::string(call) + ": status " + std::to_string(code) + " (" + message + ")");
    }
    return code;
  }

  const char* target_;
  const kiln_dataset_vtable& vt_;
  void* instance_ = nullptr;
  kiln_dataset_info info_{};
};

}  // namespace kiln::fuzz
