// The kernels for AVX-512 (F, CD, DQ, BW); built with -mavx512f -mavx512cd -mavx512dq -mavx512bw -mfma.
#include "make_kernel_table.hpp"

namespace qkv::kernels {
namespace {
constexpr kernel_table table = make_kernel_table<xsimd::avx512bw>("avx512bw");
}
const kernel_table* const avx512bw_table = &table;
}  // namespace qkv::kernels
