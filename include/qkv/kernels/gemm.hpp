// A cache-blocked, register-blocked matrix product on xsimd batches, in the
// layout of Goto and van de Geijn: B is packed into KC×NR panels that stay in
// L1, A into MR×KC panels, and an MR×NR micro-kernel keeps its tile of C in
// registers for the whole KC loop.
#pragma once

#include "blocking.hpp"
#include "register_tile.hpp"
#include "strided.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace qkv::kernels {

template <class Arch, class T>
struct gemm_kernel {
  using tile = register_tile<Arch, T>;
  using batch = typename tile::batch;
  static constexpr std::size_t W = tile::W;
  static constexpr std::size_t MR = tile::MR;
  static constexpr std::size_t NR = tile::NR;
  // The packed panels and blocks in their caches (blocking.hpp's budgets):
  // B's panel (KC×NR) in L1, A's block (MC×KC) in L2, B's block (KC×NC) in L3.
  using budget = other_blocks;
  static constexpr std::size_t KC = budget::product_l1_bytes / (NR * sizeof(T)) < budget::product_max_depth
                                        ? budget::product_l1_bytes / (NR * sizeof(T))
                                        : budget::product_max_depth;
  static constexpr std::size_t MC = (budget::product_l2_bytes / (KC * sizeof(T))) / MR * MR;
  static constexpr std::size_t NC = (budget::product_l3_bytes / (KC * sizeof(T))) / NR * NR;

  static constexpr std::size_t round_up(std::size_t x, std::size_t to) { return (x + to - 1) / to * to; }
  static constexpr std::size_t min(std::size_t a, std::size_t b) { return a < b ? a : b; }

  // Elements of the packed A block; rounded up so that the B block after it
  // starts on a 64-byte boundary too.
  static constexpr std::size_t packed_a_size(std::size_t m, std::size_t k) {
    return round_up(round_up(min(m, MC), MR) * min(k, KC), 64 / sizeof(T));
  }

  // Elements of scratch space run() needs for an m×k by k×n product.
  static constexpr std::size_t workspace(std::size_t m, std::size_t n, std::size_t k) {
    return packed_a_size(m, k) + round_up(min(n, NC), NR) * min(k, KC);
  }

  // c = a · b. `work` holds workspace(m, n, k) elements, 64-byte aligned.
  static void run(strided<const T> a, strided<const T> b, T* c, std::ptrdiff_t ldc, T* work) {
    const std::size_t m = a.rows, n = b.cols, k = a.cols;
    if (m == 0 || n == 0) return;
    if (k == 0) {
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) c[static_cast<std::ptrdiff_t>(i) * ldc + static_cast<std::ptrdiff_t>(j)] = T(0);
      return;
    }
    T* packed_a = work;
    T* packed_b = work + packed_a_size(m, k);
    for (std::size_t jc = 0; jc < n; jc += NC) {
      const std::size_t nc = min(NC, n - jc);
      for (std::size_t pc = 0; pc < k; pc += KC) {
        const std::size_t kc = min(KC, k - pc);
        pack_b(b, pc, jc, kc, nc, packed_b);
        for (std::size_t ic = 0; ic < m; ic += MC) {
          const std::size_t mc = min(MC, m - ic);
          pack_a(a, ic, pc, mc, kc, packed_a);
          for (std::size_t jr = 0; jr < nc; jr += NR) {
            for (std::size_t ir = 0; ir < mc; ir += MR) {
              T* ctile = c + static_cast<std::ptrdiff_t>(ic + ir) * ldc + static_cast<std::ptrdiff_t>(jc + jr);
              micro_kernel(kc, packed_a + ir * kc, packed_b + jr * kc, ctile, ldc, min(MR, mc - ir), min(NR, nc - jr),
                           pc != 0);
            }
          }
        }
      }
    }
  }

 private:
  // Panels of MR rows; within a panel, column p holds MR consecutive values.
  // Rows past the edge are zero, so the micro-kernel never branches on them.
  static void pack_a(strided<const T> a, std::size_t i0, std::size_t p0, std::size_t mc, std::size_t kc, T* out) {
    for (std::size_t ip = 0; ip < mc; ip += MR) {
      const std::size_t mr = min(MR, mc - ip);
      for (std::size_t r = 0; r < MR; ++r) {
        if (r < mr) {
          for (std::size_t p = 0; p < kc; ++p) out[p * MR + r] = a(i0 + ip + r, p0 + p);
        } else {
          for (std::size_t p = 0; p < kc; ++p) out[p * MR + r] = T(0);
        }
      }
      out += MR * kc;
    }
  }

  // Panels of NR columns; within a panel, row p holds NR consecutive values.
  static void pack_b(strided<const T> b, std::size_t p0, std::size_t j0, std::size_t kc, std::size_t nc, T* out) {
    for (std::size_t jp = 0; jp < nc; jp += NR) {
      const std::size_t nr = min(NR, nc - jp);
      if (nr == NR && b.col_stride == 1) {
        for (std::size_t p = 0; p < kc; ++p) {
          const T* src = b.ptr(p0 + p, j0 + jp);
          batch::load_unaligned(src).store_aligned(out + p * NR);
          batch::load_unaligned(src + W).store_aligned(out + p * NR + W);
        }
      } else {
        // Column by column: for Kᵀ this reads each row of K contiguously.
        for (std::size_t j = 0; j < NR; ++j) {
          if (j < nr) {
            for (std::size_t p = 0; p < kc; ++p) out[p * NR + j] = b(p0 + p, j0 + jp + j);
          } else {
            for (std::size_t p = 0; p < kc; ++p) out[p * NR + j] = T(0);
          }
        }
      }
      out += NR * kc;
    }
  }

  // c[0:mr, 0:nr] (+)= a_panel · b_panel over kc.
  static void micro_kernel(std::size_t kc, const T* a, const T* b, T* c, std::ptrdiff_t ldc, std::size_t mr,
                           std::size_t nr, bool accumulate) {
    const T* rows[MR];
    for (std::size_t r = 0; r < MR; ++r) rows[r] = a + r;
    tile::template run<MR>(kc, rows, b, c, ldc, mr, nr, accumulate);
  }
};

}  // namespace qkv::kernels
