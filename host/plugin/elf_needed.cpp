#include "plugin/elf_needed.hpp"

#include <elf.h>

#include <cstring>
#include <fstream>

namespace kiln::plugin {
namespace {

// Reads `count` objects of T at `offset`; false when the file is shorter.
template <typename T>
bool read_at(std::ifstream& in, uint64_t offset, size_t count, std::vector<T>& out) {
  out.resize(count);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * sizeof(T)));
  return static_cast<bool>(in);
}

bool native_elf64(const Elf64_Ehdr& h) {
  const unsigned char order = [] {
    const uint16_t one = 1;
    unsigned char first = 0;
    std::memcpy(&first, &one, 1);
    return first == 1 ? ELFDATA2LSB : ELFDATA2MSB;
  }();
  return std::memcmp(h.e_ident, ELFMAG, SELFMAG) == 0 && h.e_ident[EI_CLASS] == ELFCLASS64 &&
         h.e_ident[EI_DATA] == order && h.e_shentsize == sizeof(Elf64_Shdr);
}

}  // namespace

std::vector<std::string> elf_needed(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<Elf64_Ehdr> header;
  if (!in || !read_at(in, 0, 1, header) || !native_elf64(header[0])) return {};
  std::vector<Elf64_Shdr> sections;
  if (!read_at(in, header[0].e_shoff, header[0].e_shnum, sections)) return {};
  std::vector<std::string> needed;
  for (const Elf64_Shdr& s : sections) {
    if (s.sh_type != SHT_DYNAMIC || s.sh_link >= sections.size()) continue;
    const Elf64_Shdr& strtab = sections[s.sh_link];
    std::vector<Elf64_Dyn> entries;
    std::vector<char> strings;
    if (!read_at(in, s.sh_offset, s.sh_size / sizeof(Elf64_Dyn), entries) ||
        !read_at(in, strtab.sh_offset, strtab.sh_size, strings)) {
      return {};
    }
    for (const Elf64_Dyn& d : entries) {
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag != DT_NEEDED || d.d_un.d_val >= strings.size()) continue;
      const char* name = strings.data() + d.d_un.d_val;
      needed.emplace_back(name, strnlen(name, strings.size() - d.d_un.d_val));
    }
  }
  return needed;
}

}  // namespace kiln::plugin
