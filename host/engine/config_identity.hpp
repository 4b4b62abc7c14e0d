// A configuration's identity for checkpoints: the settings that change what training computes
// (everything but run length, logging, output and loader threading). A checkpoint records them,
// so a resume under another configuration is refused with the keys that differ.
#pragma once

#include <map>
#include <string>

#include "config/pipeline.hpp"

namespace kiln::engine {

// "section.key" -> the value as TOML ("0.1", "\"sgd\"", "[1, 2]"), for every key the identity
// covers.
using ConfigKeys = std::map<std::string, std::string>;

ConfigKeys config_identity(const config::Pipeline& pipeline);

// A hash of the same settings (CRC-32 of the resolved pipeline's lines that hold them, with its
// header line: checkpoints before ConfigKeys compare by it). Two runs of one pipeline named by
// different paths ("p.toml", "./p.toml") hash differently; their ConfigKeys agree.
std::string config_hash(const config::Pipeline& pipeline);

// The schema default (as TOML) of each key of `pipeline`'s identity that has one.
ConfigKeys identity_defaults(const config::Pipeline& pipeline);

// "optimizer.lr = 0.01 here, 0.1 in the checkpoint; ..." for the keys that differ; "" when none.
// A key the checkpoint does not record that is at its default here (`defaults`) does not differ:
// an option added since kept what the checkpoint trained with at its default.
std::string config_difference(const ConfigKeys& checkpoint, const ConfigKeys& here,
                              const ConfigKeys& defaults = {});

// The keys that may change between a checkpoint and its resume ("run.epochs, run.max_steps,
// ..."), for messages and docs.
std::string keys_free_on_resume();

}  // namespace kiln::engine
