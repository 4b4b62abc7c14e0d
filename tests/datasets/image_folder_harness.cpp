#include "image_folder_harness.hpp"

#include <ftw.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <stdexcept>

#include "scratch.hpp"

namespace kiln::dataset_test {
namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return remove(path); }

// Scratch removes the files it wrote, not folders: the oracle's trees go first (links not
// followed).
struct RemoveTrees {
  void operator()(kiln::test::Scratch* s) const {
    for (const char* sub : {"tree", "pixels"}) {
      nftw(s->path(sub).c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    delete s;
  }
};

const kiln_host_api* host() {
  static const kiln_host_api api = kiln::test::status_only_host();
  return &api;
}

}  // namespace

std::vector<uint8_t> Oracle::pixels(const std::string& name) const {
  std::ifstream in(dir + "/pixels/" + name, std::ios::binary);
  if (!in) throw std::runtime_error("the oracle wrote no " + name);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

const Oracle& oracle() {
  static const std::unique_ptr<kiln::test::Scratch, RemoveTrees> scratch = [] {
    std::unique_ptr<kiln::test::Scratch, RemoveTrees> s(new kiln::test::Scratch());
    s->write_text("config.json", "{}");
    s->run("image_folder.py");
    return s;
  }();
  static const Oracle o = [] {
    Oracle r;
    r.dir = scratch->path("");
    if (!r.dir.empty() && r.dir.back() == '/') r.dir.pop_back();
    r.manifest = nlohmann::json::parse(scratch->read_text("manifest.json"));
    return r;
  }();
  return o;
}

const kiln_plugin_descriptor& library() {
  return *kiln::test::builtin("kiln_image_folder").descriptor;
}
uint32_t library_probe() { return kiln::test::builtin("kiln_image_folder").probe; }

const kiln_component_descriptor& component() {
  const kiln_component_descriptor* c =
      kiln::test::builtin("kiln_image_folder").component("image_folder");
  if (c == nullptr) throw std::runtime_error("kiln_image_folder has no component image_folder");
  return *c;
}

const kiln_dataset_vtable& vtable() {
  return *static_cast<const kiln_dataset_vtable*>(component().vtable);
}

std::string refusal(const Status& status, int32_t code) {
  EXPECT_NE(status, nullptr);
  if (status == nullptr) return "";
  EXPECT_EQ(status->code, code) << status->message;
  return status->message;
}

Dataset::~Dataset() { vtable().destroy(instance_); }

Status Dataset::create(const Config& config, int32_t split) {
  vtable().destroy(instance_);
  instance_ = nullptr;
  Options options;
  options.set_string("root", config.root)
      .set_string("val_root", config.val_root)
      .set_string("color", config.color)
      .set_string_list("extensions", config.extensions);
  const kiln_dataset_open open{sizeof(kiln_dataset_open), split, 0, 0, config.max_pixels};
  return Status(vtable().create(host(), options.get(), &open, &instance_));
}

kiln_dataset_info Dataset::info() const {
  kiln_dataset_info out{};
  out.struct_size = sizeof out;
  Status status(vtable().info(instance_, &out));
  EXPECT_EQ(status, nullptr) << describe(status.get());
  return out;
}

Status Dataset::probe(int64_t index, kiln_sample_header* out) const {
  *out = kiln_sample_header{};
  out->struct_size = sizeof *out;
  return Status(vtable().probe(instance_, index, out));
}

Status Dataset::decode(int64_t index, int32_t scale_denom, Sample* out, size_t capacity) const {
  kiln_sample_header header{};
  header.struct_size = sizeof header;
  if (capacity == 0) {
    Status status(vtable().probe(instance_, index, &header));
    if (status != nullptr) return status;
    capacity = static_cast<size_t>(header.height * header.width * info().channels);
  }
  out->pixels.assign(capacity, 0xA5);  // a pattern to tell what the plugin wrote
  kiln_decode_request request{sizeof(kiln_decode_request), scale_denom, 0, out->pixels.data(),
                              capacity};
  kiln_decoded_sample decoded{};
  decoded.struct_size = sizeof decoded;
  Status status(vtable().decode(instance_, index, &request, &decoded));
  if (status != nullptr) return status;
  out->height = decoded.height;
  out->width = decoded.width;
  out->label = decoded.label;
  out->scale = decoded.scale;
  out->pixels.resize(static_cast<size_t>(decoded.height * decoded.width * info().channels));
  return nullptr;
}

}  // namespace kiln::dataset_test
