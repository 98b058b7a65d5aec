// The fused attention of kernels/api.hpp: the compiled kernels of the
// instruction set that runs, spread over the threads by
// kernels/attention_schedule.hpp. Many queries go by query blocks over
// packed K and V; a few (decoding) by fixed parts of the keys, each part's
// results kept and merged by log-sum-exp in part order.
#include "kernel_table.hpp"

#include <qkv/kernels/api.hpp>
#include <qkv/kernels/attention_schedule.hpp>
#include <qkv/kernels/paged_kv.hpp>

#include <cstddef>
#include <type_traits>

namespace qkv::kernels {
namespace {

// S: how K and V are stored (T, or bf16 or f16 for float).
template <class T, class S>
struct compiled_attention {
  using problem = attention_problem<T, S>;
  const attention_entries<T, S>& k;

  static attention_problem<T> without_kv_data(const problem& p) {
    if constexpr (std::is_same_v<S, T>) return p;
    else return p.without_kv_data();
  }
  bool decodes(const problem& p) const { return k.sizes.decodes(p.q.rows); }
  std::size_t shared_size(const problem& p) const { return k.sizes.shared_size(p.q.rows, p.k.rows, p.q.cols, p.v.cols); }
  void pack(const problem& p, T* shared) const { k.pack(p, shared); }
  std::size_t pieces(const problem& p) const {
    if (decodes(p)) return k.sizes.decode_parts(p.q.rows, p.k.rows);
    return (p.q.rows + k.sizes.query_rows - 1) / k.sizes.query_rows;
  }
  std::size_t scratch_size(const problem& p) const { return k.sizes.scratch_size(p.q.rows, p.k.rows, p.v.cols); }
  std::size_t kept_size(const problem& p) const {
    return decodes(p) ? pieces(p) * k.sizes.decode_part_size(p.q.rows, p.v.cols) : 0;
  }
  void piece(const problem& p, const T* shared, std::size_t b, T* scratch, T* kept) const {
    if (decodes(p)) k.decode_part(p, b, scratch, kept + b * k.sizes.decode_part_size(p.q.rows, p.v.cols));
    else k.blocks(without_kv_data(p), shared, b, b + 1, scratch);
  }
  void finish(const problem& p, const T* kept) const {
    if (decodes(p)) k.decode_merge(without_kv_data(p), kept, pieces(p));
  }
};

// Paged K and V stay in their pages for the decode parts, which read them
// in place; the query blocks get them copied contiguous (paged_kv.hpp).
template <class T, class S>
void schedule_compiled(const compiled_attention<T, S>& kernel, const attention_problem<T, S>* problems,
                       std::size_t count) {
  const auto keeps = [&](const attention_problem<T, S>& p) { return kernel.decodes(p); };
  if (!copies_pages(problems, count, keeps)) return schedule_attention(kernel, problems, count);
  const contiguous_kv<T, S> copied(problems, count, keeps);
  schedule_attention(kernel, copied.problems.data(), count);
}

template <class T, class S>
void attention_impl(const attention_problem<T, S>* problems, std::size_t count) {
  if constexpr (std::is_same_v<T, float>) {
    schedule_compiled(compiled_attention<T, S>{active_attention<S>()}, problems, count);
  } else {
    schedule_compiled(compiled_attention<T, S>{active_kernels<T>().attention}, problems, count);
  }
}

}  // namespace

void attention(const attention_problem<float>& problem) { attention_impl(&problem, 1); }
void attention(const attention_problem<double>& problem) { attention_impl(&problem, 1); }
void attention(const attention_problem<float>* problems, std::size_t count) { attention_impl(problems, count); }
void attention(const attention_problem<double>* problems, std::size_t count) { attention_impl(problems, count); }
void attention(const attention_problem<float, bf16>* problems, std::size_t count) { attention_impl(problems, count); }
void attention(const attention_problem<float, f16>* problems, std::size_t count) { attention_impl(problems, count); }

}  // namespace qkv::kernels
