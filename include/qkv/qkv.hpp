// qkv: attention written as in the papers, softmax(Q * transpose(K) / sqrt(dim<64>)) * V,
// evaluated lazily with shapes checked while compiling. The public surface, nothing else.
#pragma once

#include "shape/batch.hpp"
#include "shape/extent.hpp"
#include "shape/shape_error.hpp"
#include "numeric/dual.hpp"
#include "numeric/float16.hpp"
#include "storage/matrix.hpp"
#include "storage/matrix_view.hpp"
#include "storage/tensor.hpp"
#include "storage/tensor_view.hpp"
#include "storage/ragged.hpp"
#include "storage/ragged_view.hpp"
#include "storage/paged_view.hpp"
#include "storage/paged_append.hpp"
#include "storage/quantized.hpp"
#include "expr/scalar.hpp"
#include "expr/transpose.hpp"
#include "expr/product.hpp"
#include "expr/scaled.hpp"
#include "expr/elementwise.hpp"
#include "expr/softmax.hpp"
#include "expr/mask.hpp"
#include "expr/window.hpp"
#include "expr/key_aligned.hpp"
#include "expr/positions.hpp"
#include "expr/score_mod.hpp"
#include "expr/similarity.hpp"
#include "similarity/concept.hpp"
#include "similarity/builtin.hpp"
#include "eval/strategy.hpp"
#include "eval/eval.hpp"
#include "grad/gradient.hpp"
#include "parts/lse.hpp"
#include "eval/explain.hpp"
#include "eval/cost.hpp"
#include "eval/benchmark.hpp"
#include "kernels/api.hpp"

namespace qkv {

// The instruction set the compiled kernels run on here ("avx512bf16",
// "avx512bw", "avx2" or "sse2" on x86-64, "neon64" on AArch64: the names of
// kernels/arch_list.hpp, which set_arch takes): the best this CPU has, unless
// the environment variable QKV_ARCH (read at first use) or set_arch forces
// another; "none" while QKV_ARCH holds a name that cannot run here.
inline const char* active_arch() noexcept { return kernels::active_arch(); }

// The number of threads evaluation may use: n, or the hardware's for 0 (the
// default). Results do not depend on it. A call made while another thread's
// evaluation holds the threads runs on its calling thread alone, so calls
// from many user threads do not multiply threads.
inline void set_threads(std::size_t n) { kernels::set_threads(n); }
inline std::size_t threads() { return kernels::threads(); }

// Forces the kernels of one instruction set (a name active_arch returns; ""
// for the best available), e.g. to compare them in a benchmark.
// Throws std::invalid_argument (listing the names) for any other name, and
// std::runtime_error when this CPU or build lacks the set.
inline void set_arch(std::string_view name) { kernels::set_arch(name); }

}  // namespace qkv
