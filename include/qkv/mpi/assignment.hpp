// Which rows of the sequence each rank computes, and the moves of rows from
// one assignment to another. The contract hands rank r consecutive rows, in
// rank order. Under causal, consecutive rows give rank r about r + ½ slices'
// worth of visible pairs: the last rank does almost all the work of full
// attention. The ring then computes on the zig-zag assignment instead: the
// sequence cut into 2P chunks of equal length (within a row), rank r holding
// chunks r and 2P − 1 − r, an early one that sees few keys with a late one
// that sees many. At every step of the ring each rank then computes the same
// number of pairs (docs/distributed.md), so no rank waits for another. Q, K
// and V move there before the ring, O and L back after it: one exchange of
// each with every other rank.
#pragma once

#include "layout.hpp"
#include "transfer.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstring>
#include <vector>

namespace qkv::mpi::detail {

struct row_range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};

// Each rank's ranges of rows of the sequence, in the order it holds them.
struct assignment {
  std::vector<std::vector<row_range>> of;
  std::size_t rows(int r) const {
    std::size_t n = 0;
    for (const row_range& x : of[static_cast<std::size_t>(r)]) n += x.size();
    return n;
  }
};

// What the caller holds: rank r the rows[r] rows after those of ranks 0 … r − 1.
inline assignment consecutive(const std::vector<std::size_t>& rows) {
  assignment a;
  std::size_t at = 0;
  for (const std::size_t n : rows) a.of.push_back({{at, at + n}}), at += n;
  return a;
}

// Chunks r and 2P − 1 − r of [0, total) cut in 2P, for each rank r.
inline assignment zigzag(std::size_t total, int p) {
  const std::size_t chunks = 2 * static_cast<std::size_t>(p);
  const auto edge = [&](std::size_t c) { return total / chunks * c + total % chunks * c / chunks; };
  assignment a;
  for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
    const std::size_t late = chunks - 1 - r;
    a.of.push_back({{edge(r), edge(r + 1)}, {edge(late), edge(late + 1)}});
  }
  return a;
}

// Whether the ring balances causal work by the zig-zag assignment: causal,
// more than one rank, and no window shorter than a rank's share of the keys
// (under such a window every row past the first window sees as many keys,
// so consecutive rows are balanced already, and each rank's queries need
// only its own and its predecessor's keys).
inline bool balances_causal(const layout& lay, kernels::key_bounds b) {
  if (!b.causal || lay.size < 2) return false;
  return b.left == kernels::key_bounds::no_bound || b.left >= lay.keys() / static_cast<std::size_t>(lay.size);
}

// Rows that rank s holds under `from` and rank d under `to`: where the run
// starts in s's rows and in d's, and its length; s's ranges outer, d's inner
// (the order both sides pack and unpack them in).
struct row_run {
  std::size_t from_at = 0, to_at = 0, count = 0;
};
inline std::vector<row_run> shared_rows(const assignment& from, int s, const assignment& to, int d) {
  std::vector<row_run> runs;
  std::size_t fa = 0;
  for (const row_range& a : from.of[static_cast<std::size_t>(s)]) {
    std::size_t ta = 0;
    for (const row_range& b : to.of[static_cast<std::size_t>(d)]) {
      const std::size_t lo = a.begin > b.begin ? a.begin : b.begin, hi = a.end < b.end ? a.end : b.end;
      if (lo < hi) runs.push_back({fa + lo - a.begin, ta + lo - b.begin, hi - lo});
      ta += b.size();
    }
    fa += a.size();
  }
  return runs;
}

// x holds, for each of `batches` batch indices, this rank's rows under
// `from` (cols values each); returns the same for its rows under `to`.
// Every rank calls it with the same assignments. Rows a rank keeps are
// copied; the others go straight from x into the other rank's result, a
// message for each batch index and run of rows (no packing: fresh buffers
// cost page faults that were most of the time of a packed move).
template <class S>
std::vector<S> move_rows(const std::vector<S>& x, std::size_t batches, std::size_t cols, const assignment& from,
                         const assignment& to, int me, int tag, MPI_Comm comm) {
  const int p = static_cast<int>(from.of.size());
  const std::size_t have = from.rows(me), want = to.rows(me);
  std::vector<S> y(batches * want * cols);
  const auto at_x = [&](std::size_t b, const row_run& u) { return (b * have + u.from_at) * cols; };
  const auto at_y = [&](std::size_t b, const row_run& u) { return (b * want + u.to_at) * cols; };
  std::vector<MPI_Request> reqs;
  for (int s = 0; s < p; ++s) {
    if (s == me) continue;
    for (const row_run& u : shared_rows(from, s, to, me))
      for (std::size_t b = 0; b < batches; ++b) post_receive(y.data() + at_y(b, u), u.count * cols, s, tag, comm, reqs);
  }
  for (int d = 0; d < p; ++d)
    for (const row_run& u : shared_rows(from, me, to, d))
      for (std::size_t b = 0; b < batches; ++b) {
        if (d == me) std::memcpy(y.data() + at_y(b, u), x.data() + at_x(b, u), u.count * cols * sizeof(S));
        else post_send(x.data() + at_x(b, u), u.count * cols, d, tag, comm, reqs);
      }
  finish(reqs);
  return y;
}

}  // namespace qkv::mpi::detail
