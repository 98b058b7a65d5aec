// The block sizes of the fused attention kernel, decided in one place for
// each instruction set and element type. The kernel, qkv::cost and the
// extension path read them from here; tests hand the kernel smaller ones,
// so that every tail and every skipped block shows on small inputs.
#pragma once

#include "arch_traits.hpp"

#include <cstddef>

namespace qkv::kernels {

// The sizes, and the buffers they imply, in elements of the kernel's type.
struct blocking {
  std::size_t element_bytes;  // sizeof(T)
  std::size_t lanes;          // W, elements in a vector
  std::size_t tile_rows;      // MR, rows of the register tile
  std::size_t query_rows;     // BR, queries in a block: a multiple of MR
  std::size_t max_key_block;  // BC, keys in a block at most (a multiple of 2W)
  std::size_t mask_stretch;   // keys a mask may hide whole at a block's ends, skipped (a multiple of 2W)
  std::size_t l2_elements;    // what the packed K and V panels of a key block may take
  std::size_t sum_chunk;      // keys in one partial sum of weights · values
  std::size_t decode_rows;    // up to this many queries, the decoding path
  std::size_t decode_split;   // keys in one part of a decode (a multiple of sum_chunk and of 8)

  constexpr std::size_t tile_cols() const { return 2 * lanes; }  // NR
  friend constexpr bool operator==(const blocking&, const blocking&) = default;

  // The keys of a block for heads of dk and dv: the most (up to
  // max_key_block, a multiple of NR) whose packed K and V panels fit the L2
  // share. A BR × BC block of scores stays in L2 beside them. (Larger
  // blocks pay the online softmax's work per row and block less often.)
  constexpr std::size_t key_block(std::size_t dk, std::size_t dv) const {
    const std::size_t nr = tile_cols();
    const std::size_t fit = l2_elements / (dk + dv == 0 ? 1 : dk + dv) / nr * nr;
    return fit < nr ? nr : (fit > max_key_block ? max_key_block : fit);
  }

  // Whether the kernel's loops can work with these sizes.
  constexpr bool valid() const {
    return lanes > 0 && tile_rows > 0 && query_rows % tile_rows == 0 && max_key_block % tile_cols() == 0 &&
           max_key_block > 0 && mask_stretch % tile_cols() == 0 && mask_stretch > 0 && sum_chunk > 0 &&
           decode_split % sum_chunk == 0 && decode_split % 8 == 0;
  }

  static constexpr std::size_t round_up(std::size_t x, std::size_t to) { return (x + to - 1) / to * to; }
  // Every buffer starts on a 64-byte boundary.
  constexpr std::size_t aligned(std::size_t elements) const { return round_up(elements, 64 / element_bytes); }

  // Many queries: K packed for the score tile, V for the output tile, and a
  // flag per value row that is not finite; shared by all query blocks.
  constexpr std::size_t packed_k_size(std::size_t m, std::size_t dk) const {
    return aligned(round_up(m, tile_cols()) * dk);
  }
  constexpr std::size_t packed_v_size(std::size_t m, std::size_t dv) const {
    return aligned(round_up(dv, tile_cols()) * m);
  }
  constexpr std::size_t pack_size(std::size_t m, std::size_t dk, std::size_t dv) const {
    return packed_k_size(m, dk) + packed_v_size(m, dv) + aligned(m);
  }
  // A query block's scores, output and row statistics, per thread.
  constexpr std::size_t block_scratch_size(std::size_t dv) const {
    return aligned(query_rows * max_key_block) + aligned(query_rows * round_up(dv, tile_cols())) +
           2 * aligned(query_rows);
  }

  // A few queries: how many parts of the keys, one part's scores and
  // leftover columns (per thread), and one part's results (kept for the merge).
  constexpr bool decodes(std::size_t n) const { return n <= decode_rows; }
  constexpr std::size_t decode_parts(std::size_t n, std::size_t m) const {
    if (!decodes(n)) return 0;
    return m == 0 ? 1 : (m + decode_split - 1) / decode_split;
  }
  constexpr std::size_t decode_scratch_size(std::size_t m, std::size_t dv) const {
    return aligned(round_up(m < decode_split ? m : decode_split, lanes)) + aligned(round_up(dv, lanes));
  }
  constexpr std::size_t decode_part_size(std::size_t n, std::size_t dv) const {
    return aligned(2 * n) + n * aligned(round_up(dv, lanes));
  }

  // What one attention of n queries and m keys holds beyond its operands and
  // output, on one thread.
  constexpr std::size_t shared_size(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) const {
    return decodes(n) ? 0 : pack_size(m, dk, dv);
  }
  constexpr std::size_t scratch_size(std::size_t n, std::size_t m, std::size_t dv) const {
    return decodes(n) ? decode_scratch_size(m, dv) : block_scratch_size(dv);
  }
  constexpr std::size_t workspace_size(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) const {
    return shared_size(n, m, dk, dv) + scratch_size(n, m, dv) + decode_parts(n, m) * decode_part_size(n, dv);
  }
};

// The register tile's rows: 2·MR accumulators, two B vectors and one A
// broadcast fill 32 registers at MR = 8 and 16 at MR = 6; without FMA a
// product needs a temporary, so MR = 4.
template <class Arch>
constexpr std::size_t tile_rows_of() {
  return arch_traits<Arch>::vector_registers == 32 ? 8 : (arch_traits<Arch>::has_fma ? 6 : 4);
}

// The blocks of the other loops, the same on every instruction set.
struct other_blocks {
  // The row-block path (attention_rows.hpp): 64 rows amortise the library's
  // packing of the keys and values in its products over enough rows, and keep
  // the span a window needs near w + 64; keys are skipped in blocks of 64, a
  // multiple of every NR and of every softmax stride (2·W), so that score
  // panels never straddle two key blocks.
  static constexpr std::size_t row_path_rows = 64, row_path_keys = 64;
  // The backward's tile of keys (attention_backward.hpp), rounded up to a
  // panel and at most the forward's key block.
  static constexpr std::size_t backward_keys = 64;
  // The matrix product's cache budgets in bytes (gemm.hpp): a packed B
  // panel in about half of a 32 KiB L1, a packed A block in about 256 KiB of
  // L2, a packed B block in about 2 MiB of L3; and its deepest panel.
  static constexpr std::size_t product_l1_bytes = 16384, product_l2_bytes = 262144, product_l3_bytes = 2097152;
  static constexpr std::size_t product_max_depth = 384;
};

// The library's block sizes for instruction set Arch and element type T.
// Needs no vector type, so any translation unit can ask about any set.
template <class Arch, class T>
constexpr blocking blocking_of() {
  constexpr std::size_t mr = tile_rows_of<Arch>();
  return {.element_bytes = sizeof(T),
          .lanes = Arch::alignment() / sizeof(T),
          .tile_rows = mr,
          .query_rows = (64 + mr - 1) / mr * mr,
          .max_key_block = 512,
          .mask_stretch = 128,
          .l2_elements = 262144 / sizeof(T),
          .sum_chunk = 128,
          .decode_rows = 4,
          .decode_split = 1024};
}

}  // namespace qkv::kernels
