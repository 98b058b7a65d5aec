// Fused attention, O = softmax(S) V with S = scale·Q Kᵀ (+ biases, masks),
// for one instruction set: many queries by blocks (attention_prefill.hpp),
// a few by parts of the keys (attention_decode.hpp). Both read the scores
// through score_transform.hpp and weigh them with online_softmax.hpp; the
// block sizes come from blocking.hpp.
//
// The work is split so that a caller can spread it over threads: pack()
// fills the shared buffer (K and V, read by every query block) once; then
// blocks() runs query blocks [b0, b1) with a scratch buffer of its own. With
// at most decode_rows queries there is nothing to pack: the decode functions
// do it all, in parts of the keys that may be spread alike. A block or a part
// is computed the same way whoever runs it.
#pragma once

#include "attention_decode.hpp"
#include "attention_prefill.hpp"
#include "blocking.hpp"
#include "extension.hpp"
#include "score_transform.hpp"
#include "term_tile.hpp"

#include <cstddef>
#include <type_traits>

namespace qkv::kernels {

// Ext adds what the notation's extension points ask for (extension.hpp):
// another similarity than the dot product, a score modifier, a predicate
// mask. The library's compiled kernels use none. B is the block sizes; tests
// pass small ones.
template <class Arch, class T, class Ext = no_extension, blocking B = blocking_of<Arch, T>()>
struct attention_kernel {
  using prefill = attention_prefill<Arch, T, Ext, B>;
  using decoder = attention_decode<Arch, T, Ext, B>;
  using scores = score_transform<Arch, T, Ext>;
  static constexpr blocking sizes = B;

  static constexpr std::size_t block_rows() { return B.query_rows; }
  static constexpr std::size_t pack_size(std::size_t m, std::size_t dk, std::size_t dv) {
    return B.pack_size(m, dk, dv);
  }
  static constexpr std::size_t block_scratch_size(std::size_t dv) { return B.block_scratch_size(dv); }
  static constexpr std::size_t shared_size(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) {
    return B.shared_size(n, m, dk, dv);
  }
  static constexpr std::size_t scratch_size(std::size_t n, std::size_t m, std::size_t dv) {
    return B.scratch_size(n, m, dv);
  }

  // K and V may be stored as S (bf16 or f16 for float): pack and the decode
  // parts read them; every other step reads the packed copy, or nothing.
  template <class S>
  static void pack(const attention_problem<T, S>& p, T* shared) {
    prefill::pack(p, shared);
  }

  static void blocks(const attention_problem<T>& p, const T* shared, std::size_t b0, std::size_t b1, T* scratch) {
    for (std::size_t b = b0; b < b1; ++b) prefill::block(p, shared, b, scratch, Ext{});
  }

  // One query block with an extension object (its functors may hold state).
  static void block(const attention_problem<T>& p, const T* shared, std::size_t b, T* scratch, const Ext& ext) {
    prefill::block(p, shared, b, scratch, ext);
  }

  static constexpr std::size_t decode_parts(std::size_t n, std::size_t m) { return B.decode_parts(n, m); }
  static constexpr std::size_t decode_part_size(std::size_t n, std::size_t dv) { return B.decode_part_size(n, dv); }
  template <class S>
  static void decode_part(const attention_problem<T, S>& p, std::size_t part, T* scratch, T* part_out) {
    decoder::part(p, part, scratch, part_out);
  }
  static void decode_merge(const attention_problem<T>& p, const T* parts, std::size_t count) {
    decoder::merge(p, parts, count);
  }

  // Every part in order, into `parts` (decode_parts · decode_part_size
  // values), then the merge: the same result as the parts spread over threads.
  template <class S>
  static void decode(const attention_problem<T, S>& p, T* scratch, T* parts) {
    const std::size_t count = decode_parts(p.q.rows, p.k.rows), size = decode_part_size(p.q.rows, p.v.cols);
    for (std::size_t q = 0; q < count; ++q) decode_part(p, q, scratch, parts + q * size);
    if constexpr (std::is_same_v<S, T>) decode_merge(p, parts, count);
    else decode_merge(p.without_kv_data(), parts, count);
  }

  // The pieces the extension path and the node-by-node evaluation of the
  // extension points reuse.
  static std::size_t key_end(const attention_problem<T>& p, std::size_t i) { return scores::key_end(p, i); }
  static std::size_t key_begin(const attention_problem<T>& p, std::size_t i) { return scores::key_begin(p, i); }
  static T transform(const attention_problem<T>& p, std::size_t i, std::size_t j0, std::size_t count, T* u,
                     const Ext& ext = Ext{}) {
    return scores::apply(p, i, j0, count, u, ext);
  }
  static void modify(const Ext& ext, std::size_t i, std::size_t j0, std::size_t count, T* u, std::size_t b = 0,
                     std::size_t h = 0) {
    scores::modify(ext, i, j0, count, u, b, h);
  }
  static bool predicate_keeps_any(const Ext& ext, std::size_t i0, std::size_t rows, std::size_t j0, std::size_t cols,
                                  std::size_t b = 0, std::size_t h = 0) {
    return scores::predicate_keeps_any(ext, i0, rows, j0, cols, b, h);
  }
  static void term_tile(const Ext& ext, std::size_t dk, const T* const* a, const T* b, T* c, std::ptrdiff_t ldc,
                        std::size_t nr) {
    kernels::term_tile<Arch, T, Ext>::run(ext, dk, a, b, c, ldc, nr);
  }
};

}  // namespace qkv::kernels
