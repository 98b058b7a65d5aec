// The kernels for SSE2, which every x86-64 CPU has; built with the default flags.
#include "make_kernel_table.hpp"

namespace qkv::kernels {
template const kernel_table& kernels_of<isa_sse2>() noexcept;
}  // namespace qkv::kernels
