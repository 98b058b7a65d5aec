// The library's thread pool, for kernels instantiated outside it (those of
// the extension points, compiled in the user's translation unit).
#pragma once

#include <cstddef>
#include <functional>

namespace qkv::detail {

// Runs piece(i) for every i < count, on up to threads() threads, the caller
// among them; returns when all are done. Rethrows the first exception. A
// call from inside the pool, or while another evaluation has it, runs serially.
void parallel_for(std::size_t count, const std::function<void(std::size_t)>& piece);

}  // namespace qkv::detail
