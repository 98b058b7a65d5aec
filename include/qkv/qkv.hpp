// qkv: attention written as in the papers, softmax(Q * transpose(K) / sqrt(dim<64>)) * V,
// evaluated lazily with shapes checked while compiling. The public surface, nothing else.
#pragma once

#include "shape/extent.hpp"
#include "shape/shape_error.hpp"
#include "storage/matrix.hpp"
#include "storage/matrix_view.hpp"
#include "expr/scalar.hpp"
#include "expr/transpose.hpp"
#include "expr/product.hpp"
#include "expr/scaled.hpp"
#include "expr/elementwise.hpp"
#include "expr/softmax.hpp"
#include "expr/mask.hpp"
#include "eval/strategy.hpp"
#include "eval/eval.hpp"
#include "kernels/api.hpp"

namespace qkv {

// The instruction set the compiled kernels run on here ("avx512bw", "fma3<avx2>",
// "sse2" or "neon64"); the environment variable QKV_ARCH can force a narrower one.
inline const char* active_arch() noexcept { return kernels::active_arch(); }

}  // namespace qkv
