// Asks for the cache lines of a row ahead of its use, where a kernel knows
// what it reads next and the hardware's own prefetch does not (a stream it
// has left, or one that starts in the next tile). Locality as
// __builtin_prefetch takes it: 3 for L1, 1 for L2.
#pragma once

#include <cstddef>

namespace qkv::kernels {

template <int Locality = 3>
inline void prefetch_bytes(const void* row, std::size_t bytes) {
  for (std::size_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char*>(row) + b, 0, Locality);
}

}  // namespace qkv::kernels
