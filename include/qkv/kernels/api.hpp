// The compiled kernels, as plain functions on pointers and strides. Each call
// runs the instantiation for the best instruction set this CPU has (src/).
#pragma once

#include "attention_problem.hpp"
#include "blocking.hpp"
#include "strided.hpp"
#include "../numeric/float16.hpp"

#include <cstddef>
#include <string_view>

namespace qkv::kernels {

// c = a · b, with c row-major (row stride ldc); a and b may have any strides.
void gemm(strided<const float> a, strided<const float> b, float* c, std::ptrdiff_t ldc);
void gemm(strided<const double> a, strided<const double> b, double* c, std::ptrdiff_t ldc);

// c = w · v for weights w (a softmax's rows), where a weight of 0 reads
// nothing of its value row: NaN or ±∞ in a row of v reach only the rows of c
// that weigh it. Otherwise as gemm.
void weigh(strided<const float> w, strided<const float> v, float* c, std::ptrdiff_t ldc);
void weigh(strided<const double> w, strided<const double> v, double* c, std::ptrdiff_t ldc);

// Each row of x replaced by its softmax; a row of −∞ becomes zeros, a row
// holding a NaN becomes NaN.
void softmax_rows(strided<float> x);
void softmax_rows(strided<double> x);
// The same with one more logit, sink, in every row's denominator (an
// attention sink; −∞ is none): a row of −∞ becomes zeros.
void softmax_rows(strided<float> x, float sink);
void softmax_rows(strided<double> x, double sink);

// x ← x · s and x ← x / s.
void multiply(strided<float> x, float s);
void multiply(strided<double> x, double s);
void divide(strided<float> x, float s);
void divide(strided<double> x, double s);

// x ← x + y and x ← x − y.
void add(strided<float> x, strided<const float> y);
void add(strided<double> x, strided<const double> y);
void subtract(strided<float> x, strided<const float> y);
void subtract(strided<double> x, strided<const double> y);

// dst ← src.
void copy(strided<const float> src, strided<float> dst);
void copy(strided<const double> src, strided<double> dst);
// dst ← src read as floats (exact), a vector at a time where both rows are contiguous.
void widen(strided<const bf16> src, strided<float> dst);
void widen(strided<const f16> src, strided<float> dst);

// The fused attention of attention_problem.hpp; out must not overlap the inputs.
void attention(const attention_problem<float>& problem);
void attention(const attention_problem<double>& problem);

// Each of count independent problems, as above (the heads of a layer, the
// members of a batch); no output overlaps another output or any input.
// Consecutive problems with the same K and V views (grouped-query attention:
// several query heads per key/value head) share one packing of them. The
// results are those of the problems computed one by one.
void attention(const attention_problem<float>* problems, std::size_t count);
void attention(const attention_problem<double>* problems, std::size_t count);

// The same in float over K and V stored as bf16 or f16, read as floats
// (exactly) while they are packed or, decoding, streamed: the results are
// those of the float kernel on float copies of them.
void attention(const attention_problem<float, bf16>* problems, std::size_t count);
void attention(const attention_problem<float, f16>* problems, std::size_t count);

// The fused backward (attention_backward.hpp): g's dq, dk and dv from the
// problem, the gradient of its output, its output and row_stats (the
// problem's out and row_stats are not read). The gradients must not overlap
// anything else. The same bits whatever the number of threads. A key or
// value row that is not finite reaches only the gradients of rows that see
// it, as in the forward.
void attention_backward(const attention_problem<float>& problem, const attention_gradient<float>& g);
void attention_backward(const attention_problem<double>& problem, const attention_gradient<double>& g);
// Each of count problems as above (the heads of a layer), the same bits as
// one by one; no gradient overlaps another's or any input.
void attention_backward(const attention_problem<float>* problems, const attention_gradient<float>* g,
                        std::size_t count);
void attention_backward(const attention_problem<double>* problems, const attention_gradient<double>* g,
                        std::size_t count);

// The block sizes of the fused attention on the instruction set that runs,
// for elements of element_bytes (4: float, 8: double).
blocking active_blocking(std::size_t element_bytes);

// Threads the kernels may use (0, the default: the CPUs the process may run on), and how many.
void set_threads(std::size_t n);
std::size_t threads();

// Makes the kernels of `name` (a name of arch_list.hpp: "avx512bf16",
// "avx512bw", "avx2", "sse2", "neon64"; or "" for the best this CPU runs) run from now on. Throws
// std::invalid_argument, listing the names, for a name not in the list, and
// std::runtime_error, listing what this CPU runs, for one this CPU or build
// lacks; the kernels in use are then unchanged. Not for use while another
// thread evaluates. Without a call, the environment variable QKV_ARCH is read
// at first use, with the same names and errors, thrown by each call that
// needs the kernels until a set_arch succeeds.
void set_arch(std::string_view name);

// The name of the instruction set the kernels run on, one set_arch accepts;
// "none" while QKV_ARCH holds a bad name or one this CPU lacks.
const char* active_arch() noexcept;

// Its index in arch_list (arch_list.hpp); arch_count for "none".
std::size_t active_arch_index() noexcept;

// Whether attention on bf16 inputs with more queries than decoding takes
// multiplies bf16 pairs (vdpbf16ps; "avx512bf16" where the CPU issues them
// at least at two thirds of its FMA rate, or as QKV_BF16_PAIRS=1 or 0, read
// at first use, says) rather than converting K and V to float; false for
// "none".
bool bf16_pairs_active() noexcept;

}  // namespace qkv::kernels
