// The kernels for SSE2, which every x86-64 CPU has; built with the default flags.
#include "make_kernel_table.hpp"

namespace qkv::kernels {
namespace {
constexpr kernel_table table = make_kernel_table<xsimd::sse2>("sse2");
}
const kernel_table* const sse2_table = &table;
}  // namespace qkv::kernels
