// The shared libraries an ELF file names as needed (DT_NEEDED), read from the file itself: how
// the loader tells that a plugin library links LibTorch.
#pragma once

#include <string>
#include <vector>

namespace kiln::plugin {

// The DT_NEEDED names of the 64-bit ELF file at `path` in file order; empty when it has none,
// is not a 64-bit ELF of this machine's byte order, or cannot be read.
std::vector<std::string> elf_needed(const std::string& path);

}  // namespace kiln::plugin
