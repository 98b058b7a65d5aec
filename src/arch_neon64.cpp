// The kernels for AArch64 NEON, which every AArch64 CPU has.
#include "make_kernel_table.hpp"

namespace qkv::kernels {
template const kernel_table& kernels_of<isa_neon64>() noexcept;
}  // namespace qkv::kernels
