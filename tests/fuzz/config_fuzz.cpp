// libFuzzer target: arbitrary bytes as a pipeline file (and --set overrides) through
// kiln::config::load_pipeline_text against a registry of real and stand-in components.
//
// Input: TOML text, optionally followed by a NUL byte and "section.key=value" overrides, one
// per line (TOML text cannot contain NUL, so the split loses nothing).
//
// A ConfigError is the expected answer to a bad file. Anything else aborts, and so is a finding:
// another exception type, a sanitizer report, or a resolved pipeline whose printed form
// (to_toml, what `kiln plan` shows) does not load back to the same text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "config/pipeline.hpp"
#include "fuzz_registry.hpp"

namespace {

const kiln::plugin::Registry* registry = nullptr;

[[noreturn]] void finding(const std::string& what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzz: %s\n%s\n", what.c_str(), detail.c_str());
  std::abort();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static const kiln::plugin::Registry built = kiln::fuzz::make_registry(KILN_FUZZ_PLUGIN_DIR);
  registry = &built;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  const std::vector<std::string> overrides =
      nul == std::string::npos ? std::vector<std::string>{} : split_lines(input.substr(nul + 1));
  const std::string name = "fuzz.toml";

  std::string printed;
  try {
    printed =
        kiln::config::to_toml(kiln::config::load_pipeline_text(text, name, overrides, *registry));
  } catch (const kiln::config::ConfigError&) {
    return 0;  // a rejected file: the expected outcome for most inputs
  } catch (const std::exception& e) {
    finding("load_pipeline_text threw a non-ConfigError exception", e.what());
  }

  // The resolved pipeline, printed with every default, must load back to the same pipeline.
  std::string reprinted;
  try {
    reprinted =
        kiln::config::to_toml(kiln::config::load_pipeline_text(printed, name, {}, *registry));
  } catch (const std::exception& e) {
    finding("the printed pipeline does not load back", printed + "\n---\n" + e.what());
  }
  if (reprinted != printed) {
    finding("the printed pipeline loads back differently", printed + "\n---\n" + reprinted);
  }
  return 0;
}
