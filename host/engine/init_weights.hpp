// model.init: a run's starting weights from a safetensors file (a Kiln export, or a torchvision or
// timm state_dict saved from Python), with model.init_skip for the tensors a fine-tune replaces.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::engine {

// What load_weights did, for its summary line and for tests.
struct InitSummary {
  std::vector<std::string> loaded;      // model tensors copied from the file
  std::vector<std::string> kept;        // model tensors matching a skip pattern: left as built
  std::vector<std::string> file_skips;  // file tensors matching a skip pattern (not read)
  std::vector<std::string> unused;      // file tensors the model lacks (and no pattern matches)
  int64_t batch_counters = 0;           // num_batches_tracked counters, which Kiln does not keep
};

// Copies the tensors of the safetensors file `path` into the model's parameters and buffers of
// the same names (cast to their dtype). A model tensor whose name matches one of `skip`
// (ECMAScript regular expressions, std::regex_search, as optimizer.freeze) is left at the
// model's own initialisation whether or not the file has it. Every other model tensor must be in
// the file with the model's shape: a missing tensor or another shape throws std::runtime_error
// naming the file, the tensors and the model.init_skip pattern that would leave them out. File
// tensors the model lacks are listed in a warning, torch's num_batches_tracked counters (Kiln's
// norm layers keep none) only counted. Logs one summary line.
InitSummary load_weights(torch::nn::Module& model, const std::string& path,
                         const std::vector<std::string>& skip = {});

// The regular expression that matches `tensor`'s module and everything below it, written as a
// TOML basic string would hold it: "fc.weight" -> ^fc\\. (the pattern ^fc\. in the file).
std::string skip_pattern_for(const std::string& tensor);

}  // namespace kiln::engine
