// The precision plugins as the host sees them: kiln_amp and kiln_fp32 loaded by the host's Loader
// into a registry (with code-less stand-ins for the other pipeline slots), a component's options
// resolved from TOML by the host's config validator, and instances driven through the vtable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/options.hpp"
#include "kiln/precision.h"
#include "plugin/registry.hpp"

namespace kiln::precision_test {

// Every precision component of the two libraries, policies before aliases.
const std::vector<std::string>& all_components();

// The registry, loaded once (libraries stay loaded).
const kiln::plugin::Registry& registry();
// The precision component called `name`; throws when there is none.
const kiln::plugin::Component& component(const std::string& name);
const kiln_precision_vtable& vtable(const std::string& name);

// The options the host resolves for [precision] name = `name` plus the TOML lines `extra`
// (defaults filled, types, bounds and choices checked). Throws config::ConfigError.
kiln::config::OptionSet resolve(const std::string& name, const std::string& extra = "");

// A TOML float literal that reads back as exactly `v`.
std::string toml_float(double v);

// create's refusal as "code N: message", or "" when it accepts the options.
std::string create_refusal(const std::string& name, const kiln::config::OptionSet& options,
                           DLDeviceType device = kDLCPU);

// One instance of a component (throws ComponentError when create refuses).
class Instance {
 public:
  Instance(const std::string& name, const kiln::config::OptionSet& options,
           DLDeviceType device = kDLCPU);
  Instance(const std::string& name, const std::string& extra = "", DLDeviceType device = kDLCPU)
      : Instance(name, resolve(name, extra), device) {}
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  // The policy for a host that knows the whole 1.1 struct, preset as the host presets it.
  kiln_precision_policy policy() const;
  // One optimizer step: the scale after update_scale (unchanged when the slot is NULL).
  double update(bool grads_finite, double scale);
  // update_scale's refusal as "code N: message", or "".
  std::string update_refusal(bool grads_finite, double scale);

  const kiln_precision_vtable& vt() const { return vtable_; }
  void* handle() const { return instance_; }

 private:
  std::string name_;
  const kiln_precision_vtable& vtable_;
  void* instance_ = nullptr;
};

}  // namespace kiln::precision_test
