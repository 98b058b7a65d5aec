// What the fused attention kernel is asked to compute, in plain pointers and
// strides: O = softmax(scale·(Q Kᵀ) + bias_scale·B + col_scale·1cᵀ + row_scale·r1ᵀ,
// modified, masked) V.
// The kernel knows nothing of the expression it came from. K and V may be
// stored as S (bf16 or f16 for a float kernel), read as T exactly.
#pragma once

#include "key_bounds.hpp"
#include "strided.hpp"

#include <cstddef>
#include <limits>

namespace qkv::kernels {

template <class T, class S = T>
struct attention_problem {
  using value_type = T;    // what it computes in: q, out, biases
  using storage_type = S;  // what k and v hold

  strided<const T> q;    // n×dk, unit column stride
  strided<const S> k;    // m×dk
  strided<const S> v;    // m×dv
  strided<T> out;        // n×dv, unit column stride
  T scale = T(1);        // multiplies q·k
  strided<const T> bias{nullptr, 0, 0, 0, 1};  // n×m, unit column stride; none when data is null
  T bias_scale = T(1);
  strided<const T> col_bias{nullptr, 0, 0, 0, 1};  // 1×m, added to every row (−‖k_j‖² of neg_sq_l2); none when null
  T col_scale = T(1);
  strided<const T> row_bias{nullptr, 0, 0, 0, 1};  // n×1, added to row i before the modifier (−‖q_i‖² of
                                                    // neg_sq_l2); softmax alone ignores it; none when null
  T row_scale = T(1);
  // Which keys each row sees by causal and windows, and the row's position
  // among them (key_bounds.hpp).
  key_bounds bounds{};
  strided<const bool> mask{nullptr, 0, 0, 0, 1};  // n×m, false excludes; none when data is null
  // Q holds values of S (it was stored as S, converted exactly): the kernel
  // may multiply in S and round the weights to S, as attention on bf16
  // inputs does on AVX512-BF16 (attention_prefill_bf16.hpp). Float queries
  // keep float products.
  bool queries_in_storage_type = false;
  // One more logit in every row's softmax denominator (an attention sink):
  // the row's running maximum and sum start from it, m = sink and l = 1.
  // −∞: none.
  T sink = -std::numeric_limits<T>::infinity();
  // The batch and head indices of the slice this problem computes, passed
  // to the user's functors (0 for a matrix).
  std::size_t batch = 0, head = 0;
  // Each row's largest score m_i and its softmax's denominator
  // l_i = Σ_j exp(s_ij − m_i), written here when not null (2 values a row,
  // m then l; −∞ and 0 for a row that sees no key; a sink counts as one more
  // score, so m ≥ sink and l ≥ exp(sink − m)): what a backward pass
  // recomputes the weights from, and the log-sum-exp m + log l. Kept apart,
  // since past |m| = 2²⁴ in float m + log l rounds log l away.
  T* row_stats = nullptr;

  // The same problem with K and V as extents alone (null data): all that the
  // kernel's steps after packing read of them.
  attention_problem<T> without_kv_data() const {
    attention_problem<T> p{q, {nullptr, k.rows, k.cols, 0, 1}, {nullptr, v.rows, v.cols, 0, 1}, out, scale};
    p.bias = bias, p.bias_scale = bias_scale, p.col_bias = col_bias, p.col_scale = col_scale;
    p.row_bias = row_bias, p.row_scale = row_scale, p.bounds = bounds, p.mask = mask;
    p.queries_in_storage_type = queries_in_storage_type, p.sink = sink, p.batch = batch, p.head = head;
    p.row_stats = row_stats;
    return p;
  }
};

// The keys row i of p sees, [key_begin, key_end), and whether a block of
// rows sees any of a block of keys: key_bounds.hpp's rule on p's extents.
template <class T, class S>
std::size_t key_begin(const attention_problem<T, S>& p, std::size_t i) {
  return key_begin(p.bounds, p.q.rows, p.k.rows, i);
}
template <class T, class S>
std::size_t key_end(const attention_problem<T, S>& p, std::size_t i) {
  return key_end(p.bounds, p.q.rows, p.k.rows, i);
}
template <class T, class S>
bool bounds_keep_any(const attention_problem<T, S>& p, std::size_t i0, std::size_t rows, std::size_t j0,
                     std::size_t cols) {
  return sees_any(p.bounds, p.q.rows, p.k.rows, i0, rows, j0, cols);
}

// What the backward of an attention_problem<T> reads besides it, and writes:
// the gradient dO of the output, the forward's output O and its row_stats
// (each row's m and l), and the gradients of Q, K and V (all with unit column
// stride but dk and dv, which may have any strides); with a term that has
// weights of its own (extension.hpp's term_weight), their gradient too.
template <class T>
struct attention_gradient {
  strided<const T> d_out;  // n×dv
  strided<const T> out;    // n×dv
  const T* row_stats;      // 2n
  strided<T> dq;           // n×dk
  strided<T> dk;           // m×dk
  strided<T> dv;           // m×dv
  T* d_term_weight = nullptr;  // dk: Σ_ij dS_ij ∂term/∂w_c, when not null
  // n×m, unit column stride: the bias's gradient, bias_scale·f′·P ∘ (dP − D),
  // written where a tile is computed (the caller zeroes it), when not null.
  strided<T> d_bias{nullptr, 0, 0, 0, 1};
  // The tables a modifier reads (score_mod(S, f, P...)): their gradients,
  // tables_size entries, written by finish() when not null.
  T* d_tables = nullptr;
  std::size_t tables_size = 0;
};

}  // namespace qkv::kernels
