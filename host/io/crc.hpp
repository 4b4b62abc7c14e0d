// The two CRCs Kiln's files carry, both from Boost.CRC: CRC-32 (zlib's; checkpoint manifests and
// the config hash) and CRC-32C (Castagnoli's; the TFRecord framing of TensorBoard event files).
#pragma once

#include <boost/crc.hpp>
#include <cstddef>
#include <cstdint>

namespace kiln::io {

using Crc32 = boost::crc_32_type;
// Castagnoli's polynomial, reflected in and out, initial value and final xor all ones.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

// The Crc32 or Crc32c of `size` bytes at `data`; data that arrives in pieces goes through a Crc
// object's process_bytes.
template <class Crc>
uint32_t crc_of(const void* data, size_t size) {
  Crc crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

}  // namespace kiln::io
