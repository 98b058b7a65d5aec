// Fused attention with an extension (extension.hpp). The user's functors
// exist only in the translation unit that uses them, so the code that calls
// them is instantiated here, for the instruction set this unit is compiled
// for (xsimd::default_arch: SSE2 or NEON by default, AVX2 or AVX-512 with
// -march=native). The work is spread over the library's threads by the
// compiled kernels' own scheduler (attention_schedule.hpp), so the result
// does not depend on the number of threads.
#pragma once

#include "../storage/aligned_buffer.hpp"
#include "../storage/thread_scratch.hpp"
#include "api.hpp"
#include "arch_list.hpp"
#include "attention.hpp"
#include "attention_rows.hpp"
#include "attention_schedule.hpp"
#include "paged_kv.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkv::kernels {

// The instruction set the library's kernels run on is the one this unit is
// compiled for: the whole fused loop can run here, as fast.
template <class Arch>
bool runs_like_library() {
  const std::size_t active = active_arch_index();
  return active != arch_count && arch_is<Arch>(active);
}

// The online-softmax kernel, whole, instantiated for this unit: K and V
// packed once per problem (or group sharing them), converted there from
// their 2-byte storage S where they have it, then query blocks.
template <class T, class Ext>
struct attention_online_kernel {
  using kernel = attention_kernel<xsimd::default_arch, T, Ext>;
  template <class S>
  static std::size_t pack_size(const attention_problem<T, S>& p) {
    return kernel::pack_size(p.k.rows, p.q.cols, p.v.cols);
  }
  template <class S>
  static void pack(const attention_problem<T, S>& p, T* shared) {
    kernel::pack(p, shared);
  }
  template <class S>
  static std::size_t blocks(const attention_problem<T, S>& p) {
    return (p.q.rows + kernel::block_rows() - 1) / kernel::block_rows();
  }
  template <class S>
  static void block(const attention_problem<T, S>& p, const T* shared, std::size_t b, const Ext& ext) {
    T* scratch = detail::thread_scratch<T, detail::scratch_slot::functor_block>(kernel::block_scratch_size(p.v.cols));
    if constexpr (std::is_same_v<S, T>) kernel::block(p, shared, b, scratch, ext);
    else kernel::block(p.without_kv_data(), shared, b, scratch, ext);
  }
};

// A kernel above, with the user's functors, as attention_schedule.hpp asks
// for it; each keeps its own per-thread scratch.
template <class Kernel, class T, class Ext>
struct with_functors {
  const Ext& ext;
  template <class P>
  std::size_t shared_size(const P& p) const { return Kernel::pack_size(p); }
  template <class P>
  void pack(const P& p, T* shared) const { Kernel::pack(p, shared); }
  template <class P>
  std::size_t pieces(const P& p) const { return Kernel::blocks(p); }
  template <class P>
  std::size_t scratch_size(const P&) const { return 0; }
  template <class P>
  std::size_t kept_size(const P&) const { return 0; }
  template <class P>
  void piece(const P& p, const T* shared, std::size_t b, T*, T*) const {
    Kernel::block(p, shared, b, ext);
  }
  template <class P>
  void finish(const P&, const T*) const {}
};

// A few queries with the user's modifier or predicate over the dot
// product's scores: the decode parts (attention_decode.hpp), instantiated
// for this unit, K and V read once as stored (converted as they stream),
// never packed, the parts spread over the threads and merged in part order
// as the compiled decode does.
template <class T, class Ext>
struct decode_with_functors {
  using kernel = attention_kernel<xsimd::default_arch, T, Ext>;
  const Ext& ext;
  static constexpr bool applies = !extension_traits<Ext, T>::has_term;
  template <class P>
  static bool decodes(const P& p) { return kernel::sizes.decodes(p.q.rows); }
  template <class P>
  std::size_t shared_size(const P&) const { return 0; }
  template <class P>
  void pack(const P&, T*) const {}
  template <class P>
  std::size_t pieces(const P& p) const { return kernel::decode_parts(p.q.rows, p.k.rows); }
  template <class P>
  std::size_t scratch_size(const P& p) const { return kernel::sizes.scratch_size(p.q.rows, p.k.rows, p.v.cols); }
  template <class P>
  std::size_t kept_size(const P& p) const { return pieces(p) * kernel::decode_part_size(p.q.rows, p.v.cols); }
  template <class P>
  void piece(const P& p, const T*, std::size_t b, T* scratch, T* kept) const {
    kernel::decoder::part(p, b, scratch, kept + b * kernel::decode_part_size(p.q.rows, p.v.cols), ext);
  }
  template <class S>
  void finish(const attention_problem<T, S>& p, const T* kept) const {
    if constexpr (std::is_same_v<S, T>) kernel::decode_merge(p, kept, pieces(p));
    else kernel::decode_merge(p.without_kv_data(), kept, pieces(p));
  }
};

template <class Kernel, class T, class S, class Ext>
void attention_spread(const attention_problem<T, S>* problems, std::size_t count, const Ext& ext) {
  schedule_attention(with_functors<Kernel, T, Ext>{ext}, problems, count);
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

// The problems with K and V widened from S to T (the row-block path reads
// them in place), each distinct K or V once.
template <class T, class S>
struct widened_problems {
  std::vector<attention_problem<T>> problems;
  std::vector<detail::aligned_buffer<T>> kept;

  widened_problems(const attention_problem<T, S>* ps, std::size_t count) {
    std::vector<std::pair<const S*, const T*>> seen;
    const auto widen = [&](strided<const S> x) -> strided<const T> {
      for (const auto& [from, to] : seen)
        if (from == x.data) return {to, x.rows, x.cols, static_cast<std::ptrdiff_t>(x.cols), 1};
      kept.emplace_back(x.rows * x.cols, detail::aligned_buffer<T>::recycled);
      T* to = kept.back().data();
      for (std::size_t i = 0; i < x.rows; ++i)
        for (std::size_t c = 0; c < x.cols; ++c) to[i * x.cols + c] = static_cast<T>(x(i, c));
      seen.emplace_back(x.data, to);
      return {to, x.rows, x.cols, static_cast<std::ptrdiff_t>(x.cols), 1};
    };
    kept.reserve(2 * count);  // (no reallocation: the pointers stay)
    for (std::size_t x = 0; x < count; ++x) {
      attention_problem<T> p = ps[x].without_kv_data();
      p.k = widen(ps[x].k), p.v = widen(ps[x].v);
      problems.push_back(p);
    }
  }
};

// S: how K and V are stored (T, or bf16 or f16 for float).
template <class T, class S, class Ext>
void attention_with(const attention_problem<T, S>* problems, std::size_t count, const Ext& ext) {
  (void)active_blocking(sizeof(T));  // the kernels' set: a bad QKV_ARCH throws here, as in every evaluation
  const bool like_library = runs_like_library<xsimd::default_arch>();
  // Paged K and V stay in their pages for the decode parts alone (paged_kv.hpp).
  const auto keeps = [](const attention_problem<T, S>& p) {
    if constexpr (decode_with_functors<T, Ext>::applies) return decode_with_functors<T, Ext>::decodes(p);
    else return (void)p, false;
  };
  if (copies_pages(problems, count, keeps)) {
    const contiguous_kv<T, S> copied(problems, count, keeps);
    return attention_with(copied.problems.data(), count, ext);
  }
  // Each problem takes the path its own shape picks, whatever the others
  // in the call (a batch of prefills and decodes: batch invariance).
  std::vector<attention_problem<T, S>> rest;
  if constexpr (decode_with_functors<T, Ext>::applies) {
    std::vector<attention_problem<T, S>> decoding;
    for (std::size_t x = 0; x < count; ++x)
      (decode_with_functors<T, Ext>::decodes(problems[x]) ? decoding : rest).push_back(problems[x]);
    if (!decoding.empty()) {
      if (rest.empty()) return schedule_attention(decode_with_functors<T, Ext>{ext}, problems, count);
      schedule_attention(decode_with_functors<T, Ext>{ext}, decoding.data(), decoding.size());
      problems = rest.data(), count = rest.size();
    }
  }
  if (like_library) return attention_spread<attention_online_kernel<T, Ext>>(problems, count, ext);
  if constexpr (std::is_same_v<S, T>) {
    attention_spread<attention_rows_kernel<T, Ext>>(problems, count, ext);
  } else {
    const widened_problems<T, S> w(problems, count);
    attention_spread<attention_rows_kernel<T, Ext>>(w.problems.data(), count, ext);
  }
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
