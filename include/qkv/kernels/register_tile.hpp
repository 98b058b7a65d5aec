// The MR×NR register tile shared by the matrix product and the attention
// kernel: c[0:MR, 0:NR] (+)= A·B over kc, with the tile of C held in 2·MR
// vector registers for the whole loop. B is packed: kc rows of NR values.
// A is read through one pointer per row, element p of row r at a[r][p·ACS],
// so the same loop reads a packed panel (ACS = MR) or plain rows (ACS = 1).
#pragma once

#include "arch_traits.hpp"
#include "blocking.hpp"
#include "load_float.hpp"
#include "transpose.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstring>
#include <type_traits>

namespace qkv::kernels {

template <class Arch, class T>
struct register_tile {
  using batch = xsimd::batch<T, Arch>;
  static constexpr std::size_t W = batch::size;
  static constexpr std::size_t MR = tile_rows_of<Arch>();  // (blocking.hpp says why)
  static constexpr std::size_t NR = 2 * W;

  // c (+)= A·B for the top-left mr×nr corner of the tile. The loops over
  // rows are unrolled before g++ decides where the accumulators live: left
  // to later passes, they went through the stack at the end of every tile.
  // Never inlined: compiled alone it is the same loop for every caller, and
  // inlined into the attention kernel's block g++ made it 8% longer.
  template <std::size_t ACS>
  [[gnu::noinline]] static void run(std::size_t kc, const T* const* a, const T* b, T* c, std::ptrdiff_t ldc, std::size_t mr,
                  std::size_t nr, bool accumulate) {
    batch lo[MR], hi[MR];
    product<ACS>(kc, a, b, lo, hi);
    store(lo, hi, c, ldc, mr, nr, accumulate);
  }

  // c = A·B for a whole tile, and maxima[r·W, (r + 1)·W) lane-wise raised to
  // row r's values: the attention's scores with their row maxima taken from
  // the registers, where the max instructions use pipes the products leave
  // idle, rather than by another pass over the scores.
  template <std::size_t ACS>
  [[gnu::noinline]] static void run_keeping_max(std::size_t kc, const T* const* a, const T* b, T* c, std::ptrdiff_t ldc,
                                                T* maxima) {
    batch lo[MR], hi[MR];
    product<ACS>(kc, a, b, lo, hi);
    raise_maxima(lo, hi, maxima);
    store(lo, hi, c, ldc, MR, NR, false);
  }

  // maxima[r·W, (r + 1)·W) lane-wise raised to row r of the tile in lo, hi.
  [[gnu::always_inline]] static inline void raise_maxima(const batch* lo, const batch* hi, T* maxima) {
#pragma GCC unroll 8
    for (std::size_t r = 0; r < MR; ++r)
      xsimd::max(batch::load_aligned(maxima + r * W), xsimd::max(lo[r], hi[r])).store_aligned(maxima + r * W);
  }

  // lo, hi = A·B over kc: the loop of run.
  template <std::size_t ACS>
  [[gnu::always_inline]] static inline void product(std::size_t kc, const T* const* a, const T* b, batch* lo, batch* hi) {
#pragma GCC unroll 8
    for (std::size_t r = 0; r < MR; ++r) lo[r] = hi[r] = batch(T(0));
    for (std::size_t p = 0; p < kc; ++p) {
      const batch b0 = batch::load_aligned(b), b1 = batch::load_aligned(b + W);
#pragma GCC unroll 8
      for (std::size_t r = 0; r < MR; ++r) {
        const batch ar(a[r][p * ACS]);
        lo[r] = fmadd(ar, b0, lo[r]);
        hi[r] = fmadd(ar, b1, hi[r]);
      }
      b += NR;
    }
  }

  // c (+)= the tile held in lo and hi, for its top-left mr×nr corner: the end
  // of run, and of every tile with this layout of accumulators.
  [[gnu::always_inline]] static inline void store(batch* lo, batch* hi, T* c, std::ptrdiff_t ldc, std::size_t mr,
                                                  std::size_t nr, bool accumulate) {
    if (mr == MR && nr == NR) {
#pragma GCC unroll 8
      for (std::size_t r = 0; r < MR; ++r) {
        T* cr = c + static_cast<std::ptrdiff_t>(r) * ldc;
        if (accumulate) {
          lo[r] += batch::load_unaligned(cr);
          hi[r] += batch::load_unaligned(cr + W);
        }
        lo[r].store_unaligned(cr);
        hi[r].store_unaligned(cr + W);
      }
      return;
    }
    alignas(64) T tile[MR * NR];
#pragma GCC unroll 8
    for (std::size_t r = 0; r < MR; ++r) {
      lo[r].store_aligned(tile + r * NR);
      hi[r].store_aligned(tile + r * NR + W);
    }
    for (std::size_t r = 0; r < mr; ++r) {
      T* cr = c + static_cast<std::ptrdiff_t>(r) * ldc;
      for (std::size_t j = 0; j < nr; ++j) cr[j] = accumulate ? cr[j] + tile[r * NR + j] : tile[r * NR + j];
    }
  }

  // One value of x as T. The bf16 kernel packs K's pairs through
  // pack_transposed as 32-bit words typed float, so a value read here may be
  // bytes of another type: memcpy reads them without breaking aliasing
  // rules (the vector loads' intrinsics may alias anything).
  template <class S>
  static T value(const S* x) {
    if constexpr (std::is_same_v<S, T>) {
      T v;
      std::memcpy(&v, x, sizeof v);
      return v;
    } else {
      return static_cast<T>(*x);
    }
  }

  // Packs rows [j0, j0 + count) of a row-major matrix x (row stride ldx,
  // cols columns) as the B operand of x·something-transposed: panel by panel
  // of NR rows, each panel holding, for p < cols, the NR values x(j, p).
  // Rows past count are zero. out must hold round_up(count, NR)·cols values.
  // x may be stored as S (bf16 or f16 for a float tile): converted here.
  template <class S>
  static void pack_transposed(const S* x, std::ptrdiff_t ldx, std::ptrdiff_t cs, std::size_t count,
                              std::size_t cols, T* out) {
    for (std::size_t jp = 0; jp < count; jp += NR) {
      const std::size_t nr = count - jp < NR ? count - jp : NR;
      std::size_t p0 = 0;  // columns [0, p0) packed by register transposes
      if constexpr (transposes<Arch, T>) {
        for (; cs == 1 && p0 + W <= cols; p0 += W)
          for (std::size_t h = 0; h < NR; h += W) {
            batch r[W];
#pragma GCC unroll 16
            for (std::size_t i = 0; i < W; ++i)
              r[i] = h + i < nr ? load(x + static_cast<std::ptrdiff_t>(jp + h + i) * ldx + p0) : batch(T(0));
            transpose_square<Arch, T>(r);
#pragma GCC unroll 16
            for (std::size_t q = 0; q < W; ++q) r[q].store_unaligned(out + (p0 + q) * NR + h);
          }
      }
      for (std::size_t j = 0; j < NR; ++j) {
        if (j < nr) {
          const S* row = x + static_cast<std::ptrdiff_t>(jp + j) * ldx;
          std::size_t p = p0;
          if constexpr (!std::is_same_v<S, T>) {
            // 2-byte values converted a vector at a time (one by one, an f16
            // takes a dozen instructions without F16C).
            alignas(64) T converted[W];
            for (; cs == 1 && p + W <= cols; p += W) {
              load(row + p).store_aligned(converted);
              for (std::size_t q = 0; q < W; ++q) out[(p + q) * NR + j] = converted[q];
            }
          }
          for (; p < cols; ++p) out[p * NR + j] = value(row + static_cast<std::ptrdiff_t>(p) * cs);
        } else {
          for (std::size_t p = p0; p < cols; ++p) out[p * NR + j] = T(0);
        }
      }
      out += NR * cols;
    }
  }

  // Packs a row-major matrix x (rows × cols) as a B operand: panel by panel
  // of NR columns, each panel holding, for every row p, its NR values.
  // Columns past cols are zero. out must hold rows·round_up(cols, NR) values.
  // x may be stored as S, as above.
  template <class S>
  static void pack(const S* x, std::ptrdiff_t ldx, std::ptrdiff_t cs, std::size_t rows, std::size_t cols, T* out) {
    for (std::size_t jp = 0; jp < cols; jp += NR) {
      const std::size_t nr = cols - jp < NR ? cols - jp : NR;
      for (std::size_t p = 0; p < rows; ++p) {
        const S* src = x + static_cast<std::ptrdiff_t>(p) * ldx + static_cast<std::ptrdiff_t>(jp) * cs;
        T* dst = out + p * NR;
        if (nr == NR && cs == 1) {
          load(src).store_aligned(dst);
          load(src + W).store_aligned(dst + W);
        } else {
          for (std::size_t j = 0; j < NR; ++j) dst[j] = j < nr ? static_cast<T>(src[static_cast<std::ptrdiff_t>(j) * cs]) : T(0);
        }
      }
      out += NR * rows;
    }
  }

 private:
  template <class S>
  static batch load(const S* p) {
    if constexpr (std::is_same_v<S, T>) return batch::load_unaligned(p);
    else return load_float<Arch>(p);
  }
};

}  // namespace qkv::kernels
