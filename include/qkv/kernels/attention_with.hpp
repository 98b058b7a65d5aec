// Fused attention with an extension (extension.hpp): the kernel is
// instantiated here, in the translation unit that uses the extension, for
// the instruction set that unit is compiled for (xsimd::default_arch: SSE2 or
// NEON by default, AVX2 or AVX-512 with -march=native), since the user's
// functors exist only there. The work is spread over the library's threads
// as for the compiled kernels: K and V packed once per problem, then query
// blocks over the pool, each computed alike whoever runs it.
#pragma once

#include "../storage/aligned_buffer.hpp"
#include "attention.hpp"
#include "parallel.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace qkv::kernels {

template <class T, class Ext>
void attention_with(const attention_problem<T>* problems, std::size_t count, const Ext& ext) {
  using kernel = attention_kernel<xsimd::default_arch, T, Ext>;
  using buffer = detail::aligned_buffer<T>;
  for (std::size_t x = 0; x < count; ++x) {
    const attention_problem<T>& p = problems[x];
    const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
    if (n == 0 || dv == 0) continue;
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
