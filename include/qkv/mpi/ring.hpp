// Ring attention: each rank computes a set of query rows against every rank's
// K/V slice; the slices travel around the ring, rank r sending to r + 1 and
// receiving from r − 1, so that after P steps every rank has seen every slice
// (fewer steps where no rank's queries see the slices further back: a causal
// window). Each step's transfer is posted before the step's computation and
// completes after it (non-blocking sends and receives, tested between blocks
// of query rows so that the library can progress them). Each rank merges the
// parts' results by their rows' log-sum-exp in a fixed order (its own slice,
// then r − 1, r − 2, …; within a slice, range by range), the same whatever the
// timing, hence the same bits. Parts that the causal and window bounds hide
// from a block of queries are not computed. The rows are the caller's
// consecutive ones, or under causal the zig-zag assignment
// (mpi/assignment.hpp), moved there and back.
#pragma once

#include "../parts/part.hpp"
#include "../parts/rebind.hpp"
#include "assignment.hpp"
#include "layout.hpp"
#include "slab.hpp"
#include "transfer.hpp"

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <utility>
#include <vector>

namespace qkv::mpi::detail {

using qkv::compute_t;

// The form of e the ranks compute in: K and V as stored where the kernels
// read them so (2-byte leaves under the dot product), else what e computes in.
template <class E>
using slab_compute_t = std::conditional_t<qkv::detail::reads_half<E>() && !qkv::detail::reads_kv_as_stored<E>,
                                          compute_t<value_type_t<E>>, void>;

// The forms qkv::mpi takes; the messages where e is not one. A constexpr
// function, called in a static_assert of each entry point, so that they come
// first, before anything that the entry's result type would say.
template <class E>
constexpr bool distributable() {
  static_assert(qkv::detail::has_fused_form<E>,
                "qkv: mpi: e must be an attention with a fused form (eval(e, qkv::fused) says what breaks it)");
  static_assert(!qkv::detail::has_fused_form<E> || qkv::detail::has_rebindable_form<E>,
                "qkv: mpi: a bias or mask matrix holds one rank's scores only: write it as a predicate or score_mod of positions");
  return true;
}

// Where one rank's ring spent its time: computing, waiting for the step's
// transfers after its computation (what the computation did not hide), and
// moving rows to the zig-zag assignment and back (which waits for the other
// ranks to finish the ring); the bytes it sent around the ring, and the pairs
// of each step's parts that the causal and window bounds leave visible (one
// batch index's; what a rank computes). For the benchmarks
// (bench/ring_bench.cpp) and the balance test.
struct ring_profile {
  double compute_seconds = 0, wait_seconds = 0, move_in_seconds = 0, move_out_seconds = 0;
  std::size_t bytes_sent = 0, steps = 0;
  bool zigzag = false;
  std::vector<std::size_t> step_pairs;  // of the last call
};

// Tags: each phase waits for its transfers before the next begins, and
// messages between two ranks keep their order, so the ring's steps can share
// theirs.
inline constexpr int k_tag = 0, v_tag = 1, rows_tag = 2;

// s's rows under `to`, from its rows under `from`.
template <class S, std::size_t R>
slab<S, R> moved(const slab<S, R>& s, const assignment& from, const assignment& to, int me, MPI_Comm comm) {
  slab<S, R> y;
  y.b0 = s.b0, y.b1 = s.b1, y.cols = s.cols, y.rows = to.rows(me);
  y.data = move_rows(s.data, s.b0 * s.b1, s.cols, from, to, me, rows_tag, comm);
  return y;
}

// How many steps the ring needs: 1 + the last step at which some rank's
// queries see some of the slice it then holds. Under a causal window
// shorter than a rank's share, that is 2 (its own slice and the previous
// rank's), and the slices travel no further.
inline int ring_steps(const layout& lay, const assignment& qa, const assignment& ka, kernels::key_bounds b) {
  const int p = lay.size;
  int steps = 1;
  for (int r = 0; r < p; ++r)
    for (int t = steps; t < p; ++t)
      for (const row_range& q : qa.of[static_cast<std::size_t>(r)])
        for (const row_range& k : ka.of[static_cast<std::size_t>((r - t + p) % p)]) {
          const auto x = qkv::detail::part_bounds(b, q.size(), k.size(), {q.begin, k.begin, lay.queries(), lay.keys()});
          if (kernels::sees_any(x, q.size(), k.size(), 0, q.size(), 0, k.size())) steps = t + 1;
        }
  return steps;
}

// This rank's rows of the attention over the whole sequence, with each row's
// log-sum-exp, in an accumulator of e's compute type.
template <class E>
qkv::detail::part_accumulator<compute_t<value_type_t<E>>> ring(const E& e, MPI_Comm comm, ring_profile* profile = nullptr) {
  using C = slab_compute_t<E>;
  using T = compute_t<value_type_t<E>>;
  auto q = slab_of<C>(qkv::detail::queries_of(e));
  auto k = slab_of<C>(qkv::detail::keys_of(e));
  auto v = slab_of<C>(qkv::detail::values_of(e));
  const kernels::key_bounds bounds = qkv::detail::chain_bounds(&e.lhs().arg());
  const layout lay = agree(comm, "mpi::eval(e, comm)", facts_of(q, k, v, bounds), v.rows);
  const int r = lay.rank, p = lay.size;
  // The rows as given, and as computed.
  const assignment q_given = consecutive(lay.q_rows), k_given = consecutive(lay.k_rows);
  const bool balance = balances_causal(lay, bounds);
  const assignment qa = balance ? zigzag(lay.queries(), p) : q_given;
  const assignment ka = balance ? zigzag(lay.keys(), p) : k_given;
  double start = MPI_Wtime();
  if (balance) q = moved(q, q_given, qa, r, comm), k = moved(k, k_given, ka, r, comm), v = moved(v, k_given, ka, r, comm);
  if (profile != nullptr) {
    profile->move_in_seconds += MPI_Wtime() - start, profile->zigzag = balance;
    profile->step_pairs.assign(static_cast<std::size_t>(p), 0);
  }
  qkv::detail::part_accumulator<T> acc(q.rows, v.cols, q.b0 * q.b1);
  // Blocks of query rows, between which the transfers are progressed.
  const std::size_t block = q.rows / 4 > 256 ? (q.rows + 3) / 4 : 256;
  auto next_k = k, next_v = v;
  const int steps = ring_steps(lay, qa, ka, bounds);
  for (int t = 0; t < steps; ++t) {
    const int src = (r - t + p) % p;  // whose slice this rank holds at step t
    std::vector<MPI_Request> reqs;
    if (t + 1 < steps) {
      const std::size_t rows = ka.rows((r - t - 1 + 2 * p) % p);
      next_k.resize(rows), next_v.resize(rows);
      post_receive(next_k.data, (r - 1 + p) % p, k_tag, comm, reqs);
      post_receive(next_v.data, (r - 1 + p) % p, v_tag, comm, reqs);
      post_send(k.data, (r + 1) % p, k_tag, comm, reqs);
      post_send(v.data, (r + 1) % p, v_tag, comm, reqs);
      if (profile != nullptr) profile->bytes_sent += k.data.size() * sizeof(k.data[0]) + v.data.size() * sizeof(v.data[0]);
    }
    start = MPI_Wtime();
    // Each of this rank's ranges of queries, by blocks, against each range of
    // src's keys: a part of the whole at their positions. The sink counts in
    // the part of the rank's own first range.
    const auto& keys = ka.of[static_cast<std::size_t>(src)];
    std::size_t q_at = 0;
    for (const row_range& rows : qa.of[static_cast<std::size_t>(r)]) {
      for (std::size_t i0 = 0; i0 < rows.size(); i0 += block) {
        const std::size_t n = rows.size() - i0 < block ? rows.size() - i0 : block;
        std::size_t k_at = 0;
        for (std::size_t c = 0; c < keys.size(); ++c) {
          const qkv::detail::sequence_part part{rows.begin + i0, keys[c].begin, lay.queries(), lay.keys(), src == r && c == 0};
          const std::size_t m = keys[c].size();
          if (m != 0 || part.sink) {
            const auto x = qkv::detail::rebind(e, q.view(q_at + i0, n), k.view(k_at, m), v.view(k_at, m));
            if (profile != nullptr) profile->step_pairs[static_cast<std::size_t>(t)] += qkv::detail::part_pairs(x, part);
            acc.add(x, part, q_at + i0);
          }
          k_at += m;
        }
        progress(reqs);
      }
      q_at += rows.size();
    }
    const double computed = MPI_Wtime();
    finish(reqs);
    if (profile != nullptr) {
      profile->compute_seconds += computed - start, profile->wait_seconds += MPI_Wtime() - computed;
      profile->steps += 1;
    }
    std::swap(k, next_k), std::swap(v, next_v);
  }
  if (!balance) return acc;
  // The rows back to where the caller holds them.
  start = MPI_Wtime();
  qkv::detail::part_accumulator<T> back(lay.q_rows[static_cast<std::size_t>(r)], acc.cols, acc.count);
  back.out = move_rows(acc.out, acc.count, acc.cols, qa, q_given, r, rows_tag, comm);
  back.lse = move_rows(acc.lse, acc.count, 1, qa, q_given, r, rows_tag, comm);
  if (profile != nullptr) profile->move_out_seconds += MPI_Wtime() - start;
  return back;
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
