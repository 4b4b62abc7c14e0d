#include "io/checkpoint_state.hpp"

#include <toml++/toml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "io/untrusted.hpp"

namespace kiln::io {
namespace {

constexpr uint64_t kMaxStateBytes = uint64_t{1} << 20;

// "a string", "-3", "1e+300": what a value was, for a message.
std::string describe(const toml::node& node) {
  if (const auto* i = node.as_integer()) return std::to_string(i->get());
  if (const auto* f = node.as_floating_point()) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", f->get());
    return text;
  }
  std::ostringstream type;
  type << node.type();
  return (type.str()[0] == 'a' ? "an " : "a ") + type.str();  // "an array", "a table"
}

class StateReader {
 public:
  StateReader(const toml::table& state, const std::string& path) : state_(state), path_(path) {}

  [[noreturn]] void fail(const toml::node* at, const std::string& key,
                         const std::string& why) const {
    std::string where = path_;
    if (at != nullptr && at->source().begin.line != 0) {
      where += ":" + std::to_string(at->source().begin.line) + ":" +
               std::to_string(at->source().begin.column);
    }
    throw CheckpointError(where + ": " + key + " " + why);
  }

  const toml::node& required(const toml::table& table, const std::string& key,
                             const std::string& name) const {
    const toml::node* node = table.get(key);
    // A nested table's position helps find the gap; the whole file's says nothing.
    if (node == nullptr) fail(&table == &state_ ? nullptr : &table, name, "is missing");
    return *node;
  }

  int64_t count(const std::string& key, int64_t lowest) const {
    return integer_in(state_, key, key, lowest, kMaxStateCount);
  }

  int64_t integer_in(const toml::table& table, const std::string& key, const std::string& name,
                     int64_t lowest, int64_t highest) const {
    const toml::node& node = required(table, key, name);
    const auto* value = node.as_integer();
    if (value == nullptr || value->get() < lowest || value->get() > highest) {
      fail(&node, name,
           "must be an integer in [" + std::to_string(lowest) + ", " + std::to_string(highest) +
               "], not " + describe(node));
    }
    return value->get();
  }

  // Any TOML float (inf and nan included: an LR policy's "best so far" starts at inf).
  double number(const toml::node& node, const std::string& name) const {
    const auto* f = node.as_floating_point();
    if (f == nullptr) fail(&node, name, "must be a float, not " + describe(node));
    return f->get();
  }

  // A finite number: TOML floats, and integers exactly representable as doubles.
  double finite(const toml::node& node, const std::string& name) const {
    std::optional<double> value;
    if (const auto* f = node.as_floating_point()) value = f->get();
    if (const auto* i = node.as_integer();
        i != nullptr && i->get() >= -kMaxStateCount && i->get() <= kMaxStateCount) {
      value = static_cast<double>(i->get());
    }
    if (!value || !std::isfinite(*value)) {
      fail(&node, name, "must be a finite number, not " + describe(node));
    }
    return *value;
  }

  std::string string(const toml::node& node, const std::string& name) const {
    const auto* value = node.as_string();
    if (value == nullptr) fail(&node, name, "must be a string, not " + describe(node));
    return value->get();
  }

  const toml::table& table(const toml::table& parent, const std::string& key,
                           const std::string& name) const {
    const toml::node& node = required(parent, key, name);
    if (!node.is_table()) fail(&node, name, "must be a table, not " + describe(node));
    return *node.as_table();
  }

  CheckpointState read() const {
    CheckpointState out;
    integer_in(state_, "format", "format", kCheckpointFormat, kCheckpointFormat);
    CheckpointInfo& i = out.info;
    i.step = count("step", 0);
    i.epoch = count("epoch", 1);
    i.batches_in_epoch = count("batches_in_epoch", 0);
    i.lr_counted = count("lr_counted", 0);
    i.skipped_total = count("skipped_total", 0);
    i.skipped_in_a_row = count("skipped_in_a_row", 0);
    const toml::node& scale = required(state_, "loss_scale", "loss_scale");
    i.loss_scale = finite(scale, "loss_scale");
    if (!(i.loss_scale > 0.0)) fail(&scale, "loss_scale", "must be > 0, not " + describe(scale));
    i.config_hash = string(required(state_, "config_hash", "config_hash"), "config_hash");

    const toml::node& rule = required(state_, "scale_rule", "scale_rule");
    if (!rule.is_array()) fail(&rule, "scale_rule", "must be an array, not " + describe(rule));
    for (const toml::node& v : *rule.as_array()) {
      i.scale_rule.push_back(finite(v, "scale_rule's counter"));
    }
    // The LR policy's state, in checkpoints since ABI 1.15 (optional before).
    if (state_.contains("lr_state")) {
      const toml::node& lr = required(state_, "lr_state", "lr_state");
      if (!lr.is_array()) fail(&lr, "lr_state", "must be an array, not " + describe(lr));
      for (const toml::node& v : *lr.as_array())
        i.lr_state.push_back(number(v, "lr_state's value"));
    }
    for (const auto& [slot, what] : table(state_, "plugins", "plugins")) {
      const std::string name = "plugins." + std::string(slot.str());
      i.plugins[std::string(slot.str())] = string(what, name);
    }
    // The configuration's keys, from checkpoints since they were recorded (optional before).
    if (state_.contains("config")) {
      for (const auto& [key, value] : table(state_, "config", "config")) {
        i.config[std::string(key.str())] = string(value, "config." + std::string(key.str()));
      }
    }
    for (const auto& [file, record] : table(state_, "files", "files")) {
      const std::string name = "files." + std::string(file.str());
      if (!record.is_table()) fail(&record, name, "must be a table of size and crc32");
      const toml::table& t = *record.as_table();
      FileRecord r;
      r.size = integer_in(t, "size", name + ".size", 0, static_cast<int64_t>(kMaxCount));
      r.crc32 = static_cast<uint32_t>(integer_in(t, "crc32", name + ".crc32", 0, 0xffffffffLL));
      out.files[std::string(file.str())] = r;
    }
    return out;
  }

 private:
  const toml::table& state_;
  const std::string& path_;
};

}  // namespace

CheckpointState parse_checkpoint_state(std::string_view text, const std::string& path) {
  toml::table state;
  try {
    state = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw CheckpointError(path + ":" + std::to_string(e.source().begin.line) + ":" +
                          std::to_string(e.source().begin.column) +
                          ": not TOML: " + std::string(e.description()));
  }
  return StateReader(state, path).read();
}

CheckpointState read_checkpoint_state(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": missing or unreadable: " + std::strerror(errno));
  std::string text(kMaxStateBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw CheckpointError(path + ": cannot read: " + std::strerror(errno));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxStateBytes) {
    throw CheckpointError(path + ": over " + std::to_string(kMaxStateBytes) +
                          " bytes, not a checkpoint's state");
  }
  return parse_checkpoint_state(text, path);
}

}  // namespace kiln::io
