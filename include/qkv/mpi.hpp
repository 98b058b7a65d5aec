// Attention over a sequence split across MPI processes (optional: the
// CMake target qkv::mpi, built where MPI is found). Every rank holds
// consecutive rows of the sequence, in rank order (any lengths, none
// included), and passes the same form over them:
//
//   auto O = qkv::mpi::eval(softmax(causal(Ql * transpose(Kl) / sqrt(dim<64>))) * Vl, MPI_COMM_WORLD);
//
// O holds this rank's rows of the attention over the whole sequence, as
// eval(e) over the whole would give them. Causal, windows and the indices the
// user's functors see are positions in the whole sequence. docs/distributed.md
// describes the algorithm (mpi/ring.hpp) and its costs.
#pragma once

#include "mpi/ring.hpp"
#include "qkv.hpp"

#include <mpi.h>

#include <utility>

namespace qkv::mpi {

// This rank's rows of the attention over the whole sequence (ring attention).
template <expression E>
auto eval(const E& e, MPI_Comm comm) {
  static_assert(detail::distributable<E>());
  if constexpr (qkv::detail::has_fused_form<E> && qkv::detail::has_rebindable_form<E>)
    return detail::results(e, detail::ring(e, comm)).first;
  else return 0;  // (after the static_assert's message, no second error)
}

// {O, L}: the same with each row's log-sum-exp over the whole sequence.
template <expression E>
auto eval_with_lse(const E& e, MPI_Comm comm) {
  static_assert(detail::distributable<E>());
  if constexpr (qkv::detail::has_fused_form<E> && qkv::detail::has_rebindable_form<E>)
    return detail::results(e, detail::ring(e, comm));
  else return 0;
}

// Decoding from a cache split across ranks: every rank passes the same
// queries (the sequence's last positions) and its consecutive slice of the
// keys and values; every rank gets the attention over the whole cache, the
// same bits on each. One all-gather of the partial results.
template <expression E>
auto decode(const E& e, MPI_Comm comm) {
  static_assert(detail::distributable<E>());
  if constexpr (qkv::detail::has_fused_form<E> && qkv::detail::has_rebindable_form<E>)
    return detail::results(e, detail::sharded(e, comm)).first;
  else return 0;
}

template <expression E>
auto decode_with_lse(const E& e, MPI_Comm comm) {
  static_assert(detail::distributable<E>());
  if constexpr (qkv::detail::has_fused_form<E> && qkv::detail::has_rebindable_form<E>)
    return detail::results(e, detail::sharded(e, comm));
  else return 0;
}

}  // namespace qkv::mpi
