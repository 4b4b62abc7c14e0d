// Finds, loads and validates plugin libraries (Boost.DLL), refusing a bad one with its path and
// the reason before any of it is used, and registers the components of the good ones.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/host.h"
#include "plugin/registry.hpp"

namespace kiln::plugin {

// A refused library. what() is "<path>: <reason>".
class LoadError : public std::runtime_error {
 public:
  LoadError(std::string path, const std::string& reason)
      : std::runtime_error(path + ": " + reason), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Loads libraries; an accepted library stays loaded for the rest of the process (objects made
// by its code, and threads it started, may outlive any loader or registry).
class LibraryLoader {
 public:
  explicit LibraryLoader(const kiln_host_api* host) : host_(host) {}

  // Loads one library, validates it and adds its components to `registry`. Throws LoadError.
  void load_library(const std::string& path, Registry& registry);

  // Loads every plugin library (*.so) in `dir`, in name order. Refused libraries are appended
  // to `refused` (as LoadError messages) and skipped. A missing directory is an error entry.
  void load_directory(const std::string& dir, Registry& registry,
                      std::vector<std::string>& refused);

  // Validates a descriptor a program holds in itself (kiln_session_options.components) as a
  // library's, calls its init and adds its components to `registry`, `origin` standing for the
  // library path in the registry and in messages. Borrowed: the caller keeps `d` alive as long
  // as `registry` is used. Throws LoadError.
  void add_descriptor(const kiln_plugin_descriptor* d, const std::string& origin,
                      Registry& registry);

 private:
  // The checks and registration every descriptor goes through; `from_file`: `path` is the
  // library file (what it links can be read), else `path` only names the descriptor.
  void accept(const kiln_plugin_descriptor* d, const std::string& path, const std::string& origin,
              bool from_file, Registry& registry);

  const kiln_host_api* host_;
};

// The built-in plugin folder beside the file holding the host: <bin>/../plugins (build tree),
// <bin>/../lib/kiln/plugins (installed kiln) or <lib>/kiln/plugins (installed libkiln); empty
// when there is none.
std::string builtin_plugin_dir();

// Where plugins are looked for: the built-in folder next to the executable
// (<exe>/../plugins, or <exe>/../lib/kiln/plugins when installed), then each folder of
// KILN_PLUGIN_PATH (colon-separated), then `extra` (e.g. the pipeline's [plugins] paths).
std::vector<std::string> plugin_search_path(const std::vector<std::string>& extra);

// Loads all of `dirs` into a new registry. Refusals collected in `refused`.
Registry load_all(LibraryLoader& loader, const std::vector<std::string>& dirs,
                  std::vector<std::string>& refused);

}  // namespace kiln::plugin
