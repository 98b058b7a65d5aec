// A small fork-join pool for the kernels' independent pieces of work (query
// blocks). Why our own and not OpenMP: a library called from its users' own
// threads must not multiply their threads by its own. Here a call that finds
// the pool busy (another thread's evaluation is running on it), or that comes
// from one of the pool's workers, simply runs its pieces itself.
#pragma once

#include <qkv/kernels/parallel.hpp>

#include <cstddef>

namespace qkv::detail {

void set_pool_threads(std::size_t n);  // 0: the hardware's
std::size_t pool_threads();

}  // namespace qkv::detail
