// Fused attention with an extension (extension.hpp). The user's functors
// exist only in the translation unit that uses them, so the code that calls
// them is instantiated here, for the instruction set this unit is compiled
// for (xsimd::default_arch: SSE2 or NEON by default, AVX2 or AVX-512 with
// -march=native). The work is spread over the library's threads as for the
// compiled kernels: query blocks over the pool, each computed alike whoever
// runs it, so the result does not depend on the number of threads.
#pragma once

#include "../storage/aligned_buffer.hpp"
#include "api.hpp"
#include "arch_list.hpp"
#include "attention.hpp"
#include "attention_rows.hpp"
#include "parallel.hpp"

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace qkv::kernels {

// The instruction set the library's kernels run on is the one this unit is
// compiled for: the whole fused loop can run here, as fast.
template <class Arch>
bool runs_like_library() {
  constexpr std::size_t unit = arch_index_of<Arch>;
  return unit != arch_count && active_arch_index() == unit;
}

// The online-softmax kernel, whole, instantiated for this unit: K and V
// packed once per problem (or group sharing them), then query blocks.
template <class T, class Ext>
struct attention_online_kernel {
  using kernel = attention_kernel<xsimd::default_arch, T, Ext>;
  using buffer = detail::aligned_buffer<T>;
  static std::size_t pack_size(const attention_problem<T>& p) {
    return kernel::pack_size(p.k.rows, p.q.cols, p.v.cols);
  }
  static void pack(const attention_problem<T>& p, T* shared) { kernel::pack(p, shared); }
  static std::size_t blocks(const attention_problem<T>& p) {
    return (p.q.rows + kernel::block_rows() - 1) / kernel::block_rows();
  }
  static void block(const attention_problem<T>& p, const T* shared, std::size_t b, const Ext& ext) {
    thread_local buffer scratch;
    const std::size_t size = kernel::block_scratch_size(p.v.cols);
    if (scratch.size() < size) scratch = buffer(size, buffer::uninitialized);
    kernel::block(p, shared, b, scratch.data(), ext);
  }
};

namespace detail_with {

template <class T>
bool same_view(const strided<const T>& a, const strided<const T>& b) {
  return a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride &&
         a.col_stride == b.col_stride;
}

template <class T>
bool empty(const attention_problem<T>& p) {
  return p.q.rows == 0 || p.v.cols == 0;
}

// What a group of problems sharing K and V packs, from its first non-empty one.
template <class Kernel, class T>
const T* pack_group(const attention_problem<T>* group, std::size_t count, detail::aligned_buffer<T>& shared) {
  for (std::size_t x = 0; x < count; ++x) {
    if (empty(group[x])) continue;
    const std::size_t size = Kernel::pack_size(group[x]);
    if (shared.size() < size) shared = detail::aligned_buffer<T>(size, detail::aligned_buffer<T>::uninitialized);
    Kernel::pack(group[x], shared.data());
    break;
  }
  return shared.data();
}

}  // namespace detail_with

// Problems in groups of consecutive ones with the same K and V (the query
// heads of one key/value head), each group packed once. With many groups (at
// least two per thread) each thread takes whole groups; with few, the query
// blocks of all of a group's problems are spread over the pool, so a batch
// of short heads still fills the threads. A block is computed alike whoever
// runs it: the result does not depend on the number of threads.
template <class Kernel, class T, class Ext>
void attention_spread(const attention_problem<T>* problems, std::size_t count, const Ext& ext) {
  using buffer = detail::aligned_buffer<T>;
  std::vector<std::size_t> starts;  // group g: problems [starts[g], starts[g + 1])
  for (std::size_t x = 0; x < count; ++x)
    if (x == 0 || !detail_with::same_view(problems[x - 1].k, problems[x].k) ||
        !detail_with::same_view(problems[x - 1].v, problems[x].v))
      starts.push_back(x);
  starts.push_back(count);
  const std::size_t groups = starts.size() - 1;
  if (groups >= 2 * threads()) {
    detail::parallel_for(groups, [&](std::size_t g) {
      thread_local buffer shared;
      const attention_problem<T>* group = problems + starts[g];
      const std::size_t size = starts[g + 1] - starts[g];
      const T* packed = detail_with::pack_group<Kernel>(group, size, shared);
      for (std::size_t x = 0; x < size; ++x)
        if (!detail_with::empty(group[x]))
          for (std::size_t b = 0; b < Kernel::blocks(group[x]); ++b) Kernel::block(group[x], packed, b, ext);
    });
    return;
  }
  buffer shared;
  std::vector<std::size_t> first;  // problem x of the group: blocks [first[x], first[x + 1])
  for (std::size_t g = 0; g < groups; ++g) {
    const attention_problem<T>* group = problems + starts[g];
    const std::size_t size = starts[g + 1] - starts[g];
    const T* packed = detail_with::pack_group<Kernel>(group, size, shared);
    first.assign(size + 1, 0);
    for (std::size_t x = 0; x < size; ++x)
      first[x + 1] = first[x] + (detail_with::empty(group[x]) ? 0 : Kernel::blocks(group[x]));
    detail::parallel_for(first[size], [&](std::size_t piece) {
      const auto after = std::upper_bound(first.begin(), first.end(), piece);  // past the piece's problem
      const std::size_t x = static_cast<std::size_t>(after - first.begin()) - 1;
      Kernel::block(group[x], packed, piece - first[x], ext);
    });
  }
}

// The whole online loop on one problem.
template <class T, class Ext>
void attention_online_with(const attention_problem<T>& p, const Ext& ext) {
  attention_spread<attention_online_kernel<T, Ext>>(&p, 1, ext);
}

// The row-block path (attention_rows.hpp) on one problem, whatever this
// unit's instruction set.
template <class T, class Ext>
void attention_rows_with(const attention_problem<T>& p, const Ext& ext) {
  attention_spread<attention_rows_kernel<T, Ext>>(&p, 1, ext);
}

template <class T, class Ext>
void attention_with(const attention_problem<T>* problems, std::size_t count, const Ext& ext) {
  if (runs_like_library<xsimd::default_arch>()) attention_spread<attention_online_kernel<T, Ext>>(problems, count, ext);
  else attention_spread<attention_rows_kernel<T, Ext>>(problems, count, ext);
}

// out = the n×m scores Σ_c term(q_ic, k_jc) of an extension's similarity
// (node-by-node evaluation): the fused kernel's score tile over all keys.
// q has unit column stride.
template <class T, class Ext>
void scores_with(strided<const T> q, strided<const T> k, strided<T> out, const Ext& ext) {
  using kernel = attention_kernel<xsimd::default_arch, T, Ext>;
  using tile = register_tile<xsimd::default_arch, T>;
  using buffer = detail::aligned_buffer<T>;
  constexpr std::size_t MR = tile::MR, NR = tile::NR;
  const std::size_t n = q.rows, m = k.rows, d = q.cols;
  if (n == 0 || m == 0) return;
  buffer kp((m + NR - 1) / NR * NR * d, buffer::uninitialized);
  tile::pack_transposed(k.data, k.row_stride, k.col_stride, m, d, kp.data());
  const std::size_t panels = (n + MR - 1) / MR;
  detail::parallel_for(panels, [&](std::size_t panel) {
    const std::size_t i0 = panel * MR;
    const T* rows[MR];
    for (std::size_t r = 0; r < MR; ++r) rows[r] = q.ptr(i0 + r < n ? i0 + r : n - 1, 0);
    alignas(64) T t[MR * NR];
    for (std::size_t j0 = 0; j0 < m; j0 += NR) {
      kernel::term_tile(ext, d, rows, kp.data() + j0 * d, t, NR, NR);
      for (std::size_t r = 0; r < MR && i0 + r < n; ++r)
        for (std::size_t j = 0; j < NR && j0 + j < m; ++j) out(i0 + r, j0 + j) = t[r * NR + j];
    }
  });
}

}  // namespace qkv::kernels
