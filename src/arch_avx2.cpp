// The kernels for AVX2 with FMA; built with -mavx2 -mfma.
#include "make_kernel_table.hpp"

namespace qkv::kernels {
template const kernel_table& kernels_of<isa_avx2>() noexcept;
}  // namespace qkv::kernels
