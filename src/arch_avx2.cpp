// The kernels for AVX2 with FMA; built with -mavx2 -mfma.
#include "make_kernel_table.hpp"

namespace qkv::kernels {
namespace {
constexpr kernel_table table = make_kernel_table<xsimd::fma3<xsimd::avx2>>("fma3<avx2>");
}
const kernel_table* const avx2_table = &table;
}  // namespace qkv::kernels
