// The kernels for AVX-512 (F, CD, DQ, BW); built with -mavx512f -mavx512cd -mavx512dq -mavx512bw -mfma.
#include "make_kernel_table.hpp"

namespace qkv::kernels {
template const kernel_table& kernels_of<isa_avx512bw>() noexcept;
}  // namespace qkv::kernels
