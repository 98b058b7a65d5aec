// The kernels for AArch64 NEON, which every AArch64 CPU has.
#include "make_kernel_table.hpp"

namespace qkv::kernels {
namespace {
constexpr kernel_table table = make_kernel_table<xsimd::neon64>("neon64");
}
const kernel_table* const neon64_table = &table;
}  // namespace qkv::kernels
