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
#include "parallel.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace qkv::kernels {

// The instruction set the library's kernels run on is the one this unit is
// compiled for: the whole fused loop can run here, as fast.
template <class Arch>
bool runs_like_library() {
  constexpr std::size_t unit = arch_index_of<Arch>;
  return unit != arch_count && active_arch_index() == unit;
}

// The online-softmax kernel, whole, instantiated for this unit.
template <class T, class Ext>
void attention_online_with(const attention_problem<T>& p, const Ext& ext) {
  using kernel = attention_kernel<xsimd::default_arch, T, Ext>;
  using buffer = detail::aligned_buffer<T>;
  const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
  buffer shared(kernel::pack_size(m, dk, dv), buffer::uninitialized);
  kernel::pack(p, shared.data());
  const std::size_t blocks = (n + kernel::block_rows() - 1) / kernel::block_rows();
  detail::parallel_for(blocks, [&](std::size_t b) {
    thread_local buffer scratch;
    const std::size_t size = kernel::block_scratch_size(dv);
    if (scratch.size() < size) scratch = buffer(size, buffer::uninitialized);
    kernel::block(p, shared.data(), b, scratch.data(), ext);
  });
}

// When this unit is compiled for a narrower instruction set than the
// library runs (the default flags, say, on an AVX-512 machine): only what
// needs the user's functors runs here (a similarity's scores, the
// modifier, the predicate), on a block of 64 query rows against every key
// it may see; the softmax and the product with V run on the library's
// kernels. Memory: one 64 × m block per thread, never n × m.
template <class T, class Ext>
void attention_rows_with(const attention_problem<T>& p, const Ext& ext) {
  using kernel = attention_kernel<xsimd::default_arch, T, Ext>;
  using tile = register_tile<xsimd::default_arch, T>;
  using buffer = detail::aligned_buffer<T>;
  constexpr std::size_t rows = 64, MR = tile::MR, NR = tile::NR;
  const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols;
  buffer kp;
  if constexpr (extension_traits<Ext, T>::has_term) {
    kp = buffer((m + NR - 1) / NR * NR * dk, buffer::uninitialized);
    tile::pack_transposed(p.k.data, p.k.row_stride, p.k.col_stride, m, dk, kp.data());
  }
  const std::size_t blocks = (n + rows - 1) / rows;
  detail::parallel_for(blocks, [&](std::size_t b) {
    const std::size_t i0 = b * rows, br = rows < n - i0 ? rows : n - i0;
    const std::size_t j_end = kernel::key_end(p, i0 + br - 1);
    const std::size_t ld = (j_end + NR - 1) / NR * NR + NR;
    thread_local buffer s;
    const std::size_t size = ((br + MR - 1) / MR * MR) * ld;
    if (s.size() < size) s = buffer(size, buffer::uninitialized);
    T* sd = s.data();
    if (j_end > 0) {
      if constexpr (extension_traits<Ext, T>::has_term) {
        for (std::size_t ir = 0; ir < br; ir += MR) {
          const T* q_rows[MR];
          for (std::size_t r = 0; r < MR; ++r) q_rows[r] = p.q.ptr(i0 + (ir + r < br ? ir + r : br - 1), 0);
          for (std::size_t jr = 0; jr < j_end; jr += NR)
            kernel::term_tile(ext, dk, q_rows, kp.data() + jr * dk, sd + ir * ld + jr, static_cast<std::ptrdiff_t>(ld),
                              NR);
        }
      } else {
        const strided<const T> qb{p.q.ptr(i0, 0), br, dk, p.q.row_stride, p.q.col_stride};
        const strided<const T> kt{p.k.data, dk, j_end, p.k.col_stride, p.k.row_stride};
        gemm(qb, kt, sd, static_cast<std::ptrdiff_t>(ld));
      }
      for (std::size_t r = 0; r < br; ++r) {
        T* u = sd + r * ld;
        const T a = kernel::transform(p, i0 + r, 0, j_end, u, ext);
        if (a != T(1))
          for (std::size_t j = 0; j < j_end; ++j) u[j] *= a;
      }
      softmax_rows(strided<T>{sd, br, j_end, static_cast<std::ptrdiff_t>(ld), 1});
    }
    const strided<const T> pb{sd, br, j_end, static_cast<std::ptrdiff_t>(ld), 1};
    const strided<const T> vb{p.v.data, j_end, p.v.cols, p.v.row_stride, p.v.col_stride};
    weigh(pb, vb, p.out.ptr(i0, 0), p.out.row_stride);  // a masked key reads nothing of its value row
  });
}

template <class T, class Ext>
void attention_with(const attention_problem<T>* problems, std::size_t count, const Ext& ext) {
  const bool online = runs_like_library<xsimd::default_arch>();
  for (std::size_t x = 0; x < count; ++x) {
    const attention_problem<T>& p = problems[x];
    if (p.q.rows == 0 || p.v.cols == 0) continue;
    if (online) attention_online_with(p, ext);
    else attention_rows_with(p, ext);
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
