// Options the precision components refuse: first by the host's validator from the option specs
// (choices, bounds), then by create for what specs cannot say (orderings, open intervals), and by
// create when a caller bypasses the validator.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "config/options.hpp"
#include "config_values.hpp"
#include "precision_harness.hpp"

namespace kiln::precision_test {
namespace {

using kiln::config::ConfigError;
using kiln::config::OptionSet;
using kiln::config::Value;
using kiln::test::float_value;
using kiln::test::int_value;
using kiln::test::string_value;

// The host validator's message for [precision] name = `name` plus `extra`, or "".
std::string config_error(const std::string& name, const std::string& extra) {
  try {
    resolve(name, extra);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// create's refusal for options the host accepted.
std::string refusal(const std::string& name, const std::string& extra,
                    DLDeviceType device = kDLCPU) {
  return create_refusal(name, resolve(name, extra), device);
}

// create's refusal of `name`'s default options with `key` replaced, bypassing the validator.
std::string direct(const std::string& name, const std::string& key, const Value& value) {
  OptionSet options = resolve(name);
  options.set(key, value);
  return create_refusal(name, options);
}

TEST(HostRefuses, ChoicesAndBoundsFromTheSpecs) {
  const std::string dtype = config_error("amp", "dtype = \"fp8\"");
  EXPECT_NE(dtype.find("precision.dtype"), std::string::npos) << dtype;
  EXPECT_NE(dtype.find("fp8"), std::string::npos) << dtype;
  EXPECT_NE(dtype.find("bf16"), std::string::npos) << dtype;  // names what is allowed
  const std::string scaling = config_error("o2", "scaling = \"always\"");
  EXPECT_NE(scaling.find("precision.scaling"), std::string::npos) << scaling;
  const std::string at_min = config_error("amp", "at_min_scale = \"ignore\"");
  EXPECT_NE(at_min.find("precision.at_min_scale"), std::string::npos) << at_min;
  for (const char* bad :
       {"init_scale = 0.0", "init_scale = -1.0", "init_scale = inf", "growth_factor = 0.5",
        "backoff_factor = 0.0", "backoff_factor = 2.0", "growth_interval = 0", "hysteresis = 0",
        "min_scale = 0.0", "max_scale = 1e39"}) {
    const std::string message = config_error("amp", bad);
    const std::string key = std::string(bad).substr(0, std::string(bad).find(' '));
    EXPECT_NE(message.find("precision." + key), std::string::npos) << bad << ": " << message;
  }
  // Options a component does not have are unknown keys.
  EXPECT_NE(config_error("16-mixed", "dtype = \"bf16\"").find("precision.dtype"),
            std::string::npos);
  EXPECT_NE(config_error("bf16", "scaling = \"dynamic\"").find("precision.scaling"),
            std::string::npos);
  EXPECT_NE(config_error("amp", "keep_norm_fp32 = false").find("precision.keep_norm_fp32"),
            std::string::npos);
}

TEST(CreateRefuses, WhatTheSpecsCannotSay) {
  EXPECT_EQ(refusal("amp", "growth_factor = 1.0"),
            "code 1: amp: growth_factor must be finite and > 1, got 1");
  EXPECT_EQ(refusal("amp", "backoff_factor = 1.0"),
            "code 1: amp: backoff_factor must be in (0, 1), got 1");
  EXPECT_EQ(refusal("o2", "min_scale = 2.0\nmax_scale = 1.0"),
            "code 1: o2: min_scale (2) must not exceed max_scale (1)");
  // Dynamic scaling starts inside its bounds (the defaults: [1, 2^24]).
  EXPECT_EQ(refusal("16-mixed", "init_scale = 0.5"),
            "code 1: 16-mixed: dynamic scaling needs min_scale <= init_scale <= max_scale, got "
            "1 <= 0.5 <= 16777216");
  EXPECT_EQ(refusal("amp", "init_scale = 33554432.0", kDLCUDA),
            "code 1: amp: dynamic scaling needs min_scale <= init_scale <= max_scale, got 1 <= "
            "33554432 <= 16777216");
  EXPECT_EQ(refusal("O3", "scaling = \"dynamic\"\nmin_scale = 131072.0"),
            "code 1: O3: dynamic scaling needs min_scale <= init_scale <= max_scale, got 131072 "
            "<= 65536 <= 16777216");
  // The same init_scale is fine where the scale is static, or absent.
  EXPECT_EQ(refusal("16-mixed", "init_scale = 0.5\nscaling = \"static\""), "");
  EXPECT_EQ(refusal("o3", "init_scale = 0.5"), "");
  // Each component names itself.
  EXPECT_EQ(refusal("16-true", "growth_factor = 1.0"),
            "code 1: 16-true: growth_factor must be finite and > 1, got 1");
}

TEST(CreateRefuses, WhatTheValidatorWouldHaveCaught) {
  EXPECT_EQ(direct("amp", "dtype", string_value("fp8")),
            "code 1: amp: dtype must be auto, fp16 or bf16, got 'fp8'");
  EXPECT_EQ(direct("O2", "scaling", string_value("always")),
            "code 1: O2: scaling must be auto, dynamic, static or none, got 'always'");
  EXPECT_EQ(direct("amp", "at_min_scale", string_value("ignore")),
            "code 1: amp: at_min_scale must be stop or skip, got 'ignore'");
  EXPECT_EQ(direct("amp", "growth_interval", int_value(0)),
            "code 1: amp: growth_interval must be >= 1, got 0");
  EXPECT_EQ(direct("o3", "hysteresis", int_value(-2)),
            "code 1: o3: hysteresis must be >= 1, got -2");
  EXPECT_EQ(direct("amp", "init_scale", float_value(std::numeric_limits<double>::infinity())),
            "code 1: amp: init_scale must be > 0 and fit float32, got inf");
  EXPECT_EQ(direct("amp", "init_scale", float_value(1e39)),
            "code 1: amp: init_scale must be > 0 and fit float32, got 1e+39");
  EXPECT_EQ(direct("amp", "backoff_factor", float_value(std::nan(""))),
            "code 1: amp: backoff_factor must be in (0, 1), got nan");
  EXPECT_EQ(direct("amp", "growth_factor", float_value(std::numeric_limits<double>::infinity())),
            "code 1: amp: growth_factor must be finite and > 1, got inf");
  EXPECT_EQ(direct("o2", "min_scale", float_value(0.0)),
            "code 1: o2: min_scale and max_scale must be > 0 and fit float32, got 0 and "
            "16777216");
}

TEST(CreateRefuses, DevicesOtherThanCpuAndCuda) {
  for (const char* name : {"amp", "bf16", "o2", "o3", "bf16-true"}) {
    EXPECT_EQ(create_refusal(name, resolve(name), kDLMetal),
              std::string("code 2: ") + name +
                  ": runs on cpu and cuda devices only, got DLPack device type 8");
  }
}

}  // namespace
}  // namespace kiln::precision_test
