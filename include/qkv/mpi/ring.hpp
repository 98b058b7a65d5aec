// Ring attention: each rank holds consecutive rows of Q, K and V; the K/V
// slices travel around the ring, rank r sending to r + 1 and receiving from
// r − 1, so that after P steps every rank has seen every slice. Each step's
// transfer is posted before the step's computation and completes after it
// (non-blocking sends and receives, tested between blocks of query rows so
// that the library can progress them). Each rank merges the slices' partial
// results by their rows' log-sum-exp in the order they arrive: its own, then
// r − 1, r − 2, …, the same order whatever the timing, hence the same bits.
// Slices that the causal and window bounds hide from all of a rank's
// queries are passed on without being computed.
#pragma once

#include "../eval/part.hpp"
#include "../eval/rebind.hpp"
#include "layout.hpp"
#include "slab.hpp"

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <utility>
#include <vector>

namespace qkv::mpi::detail {

using qkv::compute_t;

// Non-blocking transfers of a buffer, in pieces that fit MPI's int counts.
inline constexpr std::size_t piece_bytes = std::size_t(1) << 30;

template <class S>
void post_send(const std::vector<S>& x, int to, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs) {
  const std::size_t bytes = x.size() * sizeof(S);
  const char* p = reinterpret_cast<const char*>(x.data());
  for (std::size_t at = 0; at == 0 || at < bytes; at += piece_bytes) {
    const std::size_t len = bytes - at < piece_bytes ? bytes - at : piece_bytes;
    reqs.emplace_back();
    MPI_Isend(p + at, static_cast<int>(len), MPI_BYTE, to, tag, comm, &reqs.back());
    if (bytes == 0) break;
  }
}
template <class S>
void post_receive(std::vector<S>& x, int from, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs) {
  const std::size_t bytes = x.size() * sizeof(S);
  char* p = reinterpret_cast<char*>(x.data());
  for (std::size_t at = 0; at == 0 || at < bytes; at += piece_bytes) {
    const std::size_t len = bytes - at < piece_bytes ? bytes - at : piece_bytes;
    reqs.emplace_back();
    MPI_Irecv(p + at, static_cast<int>(len), MPI_BYTE, from, tag, comm, &reqs.back());
    if (bytes == 0) break;
  }
}

inline void progress(std::vector<MPI_Request>& reqs) {
  int done = 0;
  if (!reqs.empty()) MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
}

// The form of e the ranks compute in: K and V as stored where the kernels
// read them so (2-byte leaves under the dot product), else what e computes in.
template <class E>
using slab_compute_t = std::conditional_t<qkv::detail::reads_half<E>() && !qkv::detail::reads_kv_as_stored<E>,
                                          compute_t<value_type_t<E>>, void>;

template <class E>
void require_distributable() {
  static_assert(qkv::detail::has_fused_form<E>,
                "qkv: mpi: e must be an attention with a fused form (eval(e, qkv::fused) says what breaks it)");
  static_assert(!qkv::detail::has_fused_form<E> || qkv::detail::has_rebindable_form<E>,
                "qkv: mpi: a bias or mask matrix holds one rank's scores only; write it as a predicate or score_mod of positions");
}

// Where one rank's ring spent its time: computing, and waiting for the
// step's transfers after its computation (what the computation did not
// hide); the bytes it sent. For the benchmarks (bench/ring_bench.cpp).
struct ring_profile {
  double compute_seconds = 0, wait_seconds = 0;
  std::size_t bytes_sent = 0, steps = 0;
};

// This rank's rows of the attention over the whole sequence, with each row's
// log-sum-exp, in an accumulator of e's compute type.
template <class E>
qkv::detail::part_accumulator<compute_t<value_type_t<E>>> ring(const E& e, MPI_Comm comm, ring_profile* profile = nullptr) {
  using C = slab_compute_t<E>;
  const auto q = slab_of<C>(qkv::detail::queries_of(e));
  auto k = slab_of<C>(qkv::detail::keys_of(e));
  auto v = slab_of<C>(qkv::detail::values_of(e));
  const layout lay = agree(comm, "mpi::eval(e, comm)", facts_of(q, k, v, qkv::detail::chain_bounds(&e.lhs().arg())), v.rows);
  const int r = lay.rank, p = lay.size;
  qkv::detail::part_accumulator<compute_t<value_type_t<E>>> acc(q.rows, v.cols, q.b0 * q.b1);
  // Blocks of query rows, between which the transfers are progressed.
  const std::size_t block = q.rows / 4 > 256 ? (q.rows + 3) / 4 : 256;
  auto next_k = k, next_v = v;
  for (int t = 0; t < p; ++t) {
    const int src = (r - t + p) % p;  // whose slice this rank holds at step t
    std::vector<MPI_Request> reqs;
    if (t + 1 < p) {
      const std::size_t rows = lay.k_rows[static_cast<std::size_t>((r - t - 1 + 2 * p) % p)];
      next_k.resize(rows), next_v.resize(rows);
      post_receive(next_k.data, (r - 1 + p) % p, 2 * t, comm, reqs);
      post_receive(next_v.data, (r - 1 + p) % p, 2 * t + 1, comm, reqs);
      post_send(k.data, (r + 1) % p, 2 * t, comm, reqs);
      post_send(v.data, (r + 1) % p, 2 * t + 1, comm, reqs);
      if (profile != nullptr) profile->bytes_sent += k.data.size() * sizeof(k.data[0]) + v.data.size() * sizeof(v.data[0]);
    }
    const double start = MPI_Wtime();
    for (std::size_t i0 = 0; i0 < q.rows; i0 += block) {
      const std::size_t n = q.rows - i0 < block ? q.rows - i0 : block;
      const qkv::detail::sequence_part part{lay.q_origin(r) + i0, lay.k_origin(src), lay.queries(), lay.keys(), src == r};
      acc.add(qkv::detail::rebind(e, q.view(i0, n), k.view(), v.view()), part, i0);
      progress(reqs);
    }
    const double computed = MPI_Wtime();
    if (!reqs.empty()) MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
    if (profile != nullptr) {
      profile->compute_seconds += computed - start, profile->wait_seconds += MPI_Wtime() - computed;
      profile->steps += 1;
    }
    std::swap(k, next_k), std::swap(v, next_v);
  }
  return acc;
}

// Every rank's queries (the same on each) against its own slice of the
// keys, merged in rank order on every rank: one all-gather of the partial
// results (each n rows of O and L per batch index).
template <class E>
qkv::detail::part_accumulator<compute_t<value_type_t<E>>> sharded(const E& e, MPI_Comm comm) {
  using C = slab_compute_t<E>;
  using T = compute_t<value_type_t<E>>;
  const auto q = slab_of<C>(qkv::detail::queries_of(e));
  const auto k = slab_of<C>(qkv::detail::keys_of(e));
  const auto v = slab_of<C>(qkv::detail::values_of(e));
  form_facts facts = facts_of(q, k, v, qkv::detail::chain_bounds(&e.lhs().arg()));
  facts.same.push_back({"rows of Q (the same queries on every rank)", q.rows});
  const layout lay = agree(comm, "mpi::decode(e, comm)", facts, v.rows);
  const int r = lay.rank, p = lay.size;
  qkv::detail::part_accumulator<T> mine(q.rows, v.cols, q.b0 * q.b1);
  mine.add(qkv::detail::rebind(e, q.view(), k.view(), v.view()),
           {0, lay.k_origin(r), q.rows, lay.keys(), r == 0});
  const std::size_t no = mine.out.size(), nl = mine.lse.size();
  std::vector<T> all_o(no * static_cast<std::size_t>(p)), all_l(nl * static_cast<std::size_t>(p));
  MPI_Allgather(mine.out.data(), static_cast<int>(no * sizeof(T)), MPI_BYTE, all_o.data(), static_cast<int>(no * sizeof(T)),
                MPI_BYTE, comm);
  MPI_Allgather(mine.lse.data(), static_cast<int>(nl * sizeof(T)), MPI_BYTE, all_l.data(), static_cast<int>(nl * sizeof(T)),
                MPI_BYTE, comm);
  qkv::detail::part_accumulator<T> acc(q.rows, v.cols, q.b0 * q.b1);
  const std::size_t d = v.cols;
  for (int s = 0; s < p; ++s)
    for (std::size_t x = 0; x < nl; ++x) {
      T* o = acc.out.data() + x * d;
      const T* part = all_o.data() + static_cast<std::size_t>(s) * no + x * d;
      acc.lse[x] = qkv::detail::merge_rows(acc.lse[x], [&](std::size_t c) { return o[c]; },
                                           all_l[static_cast<std::size_t>(s) * nl + x],
                                           [&](std::size_t c) { return part[c]; }, d, o);
    }
  return acc;
}

// e's result and log-sum-exps from an accumulator of its rows.
template <class E, class T>
auto results(const E& e, const qkv::detail::part_accumulator<T>& acc) {
  using O = result_t<E>;
  using V = std::remove_const_t<value_type_t<O>>;
  using L = qkv::detail::lse_t<E>;
  auto [o, l] = [&] {
    if constexpr (qkv::detail::is_batched_v<E>) {
      auto x = qkv::detail::result_extents(e);
      auto y = x;
      y.back() = 1;
      return std::pair<O, L>{O(x), L(y)};
    } else {
      return std::pair<O, L>{O(e.rows(), e.cols()), L(e.rows(), 1)};
    }
  }();
  const std::size_t n = acc.rows, d = acc.cols;
  for (std::size_t x = 0; x < acc.count; ++x)
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t c = 0; c < d; ++c) {
        const T y = acc.out[(x * n + i) * d + c];
        if constexpr (qkv::detail::is_batched_v<E>) o.data()[(x * n + i) * d + c] = static_cast<V>(y);
        else o(i, c) = static_cast<V>(y);
      }
      l.data()[x * n + i] = acc.lse[x * n + i];
    }
  return std::pair<O, L>{std::move(o), std::move(l)};
}

}  // namespace qkv::mpi::detail
