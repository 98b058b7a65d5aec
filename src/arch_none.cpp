// Null tables for the instruction sets of the other CPU family.
#include "kernel_table.hpp"

namespace qkv::kernels {
#if defined(__x86_64__) || defined(_M_X64)
const kernel_table* const neon64_table = nullptr;
#else
const kernel_table* const avx512bw_table = nullptr;
const kernel_table* const avx2_table = nullptr;
const kernel_table* const sse2_table = nullptr;
#endif
}  // namespace qkv::kernels
