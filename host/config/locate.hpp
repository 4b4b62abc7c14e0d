// Pointing a problem found after parsing (a component's refusal of its options, a combination
// the engine cannot run) at the key it concerns, so that it reads like every other
// configuration error: "file:line:column: section.key: reason".
#pragma once

#include <string>

#include "config/pipeline.hpp"

namespace kiln::config {

// Where `key` ("section.key") got its value, as messages start: the value's file:line:column,
// the --set that gave it, or, for a default, the [section] header (the file itself when the
// file has no such table). "norm.name" is where the norm component was chosen (model.norm
// when that swapped it).
std::string key_location(const Pipeline& pipeline, const std::string& key);
// The same position as a SourcePos (file "" never: the pipeline's path at worst).
SourcePos key_source(const Pipeline& pipeline, const std::string& key);

// ConfigError "<key_location>: <key>: <message>".
ConfigError located_error(const Pipeline& pipeline, const std::string& key,
                          const std::string& message);

// The key of `choice` that a refusal `message` is about: the first of the component's options
// (then the section's core keys) named in it as a word, preferring keys the pipeline set over
// defaults; else the string option whose value (a path) the message holds; else the key that
// names the component ("<section>.name", "data.dataset").
std::string key_named_in(const ComponentChoice& choice, const std::string& message);

// The component chosen for `section` ("model", "norm", "optimizer", "lr_policy", "precision"),
// or nullptr for another section.
const ComponentChoice* choice_of(const Pipeline& pipeline, const std::string& section);

}  // namespace kiln::config
