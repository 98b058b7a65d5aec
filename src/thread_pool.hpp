// A small fork-join pool for the kernels' independent pieces of work (query
// blocks). Why our own and not OpenMP: a library called from its users' own
// threads must not multiply their threads by its own. Here a call that finds
// the pool busy (another thread's evaluation is running on it), or that comes
// from one of the pool's workers, simply runs its pieces itself.
#pragma once

#include <cstddef>
#include <functional>

namespace qkv::detail {

// Runs piece(i) for every i < count, on up to threads() threads, the caller
// among them; returns when all are done. Rethrows the first exception.
void parallel_for(std::size_t count, const std::function<void(std::size_t)>& piece);

void set_pool_threads(std::size_t n);  // 0: the hardware's
std::size_t pool_threads();

}  // namespace qkv::detail
