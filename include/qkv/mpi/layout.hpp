// Who holds which rows of the sequence, agreed by every rank before any
// computation: each rank's query and key rows, gathered once, and the checks
// that every rank passed the same form (the extents that are not rows, the
// element types, causal and window bounds). A rank that disagrees makes
// every rank throw the same qkv: error, rather than hang in a ring that
// cannot complete.
#pragma once

#include "../qkv.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace qkv::mpi::detail {

struct layout {
  int rank = 0, size = 1;
  std::vector<std::size_t> q_rows, k_rows;  // per rank
  std::size_t k_origin(int r) const { return prefix(k_rows, r); }
  std::size_t queries() const { return prefix(q_rows, size); }
  std::size_t keys() const { return prefix(k_rows, size); }

 private:
  static std::size_t prefix(const std::vector<std::size_t>& v, int r) {
    std::size_t s = 0;
    for (int x = 0; x < r; ++x) s += v[static_cast<std::size_t>(x)];
    return s;
  }
};

// What must agree, by name, and this rank's rows.
struct form_facts {
  std::vector<std::pair<const char*, std::uint64_t>> same;
  std::uint64_t q_rows = 0, k_rows = 0;
};

template <class Q, class K, class V>
form_facts facts_of(const Q& q, const K& k, const V& v, kernels::key_bounds b) {
  form_facts f;
  f.same = {{"rank of Q", Q::rank},      {"leading extent of Q", q.b0}, {"heads of Q", q.b1},
            {"columns of Q (dk)", q.cols}, {"leading extent of K", k.b0}, {"heads of K", k.b1},
            {"columns of K (dk)", k.cols}, {"leading extent of V", v.b0}, {"heads of V", v.b1},
            {"columns of V (dv)", v.cols}, {"element size of Q", sizeof(typename Q::element)},
            {"element size of K", sizeof(typename K::element)}, {"element size of V", sizeof(typename V::element)},
            {"causal", b.causal ? 1u : 0u},
            {"window's left extent (w − 1 for window(S, w))", b.left}, {"window's right extent", b.right},
            {"positions", b.positioned ? 1u : 0u},
            {"positions' q0 − k0", static_cast<std::uint64_t>(b.shift)}};
  f.q_rows = q.rows, f.k_rows = k.rows;
  return f;
}

// Gathers every rank's facts; throws qkv::shape_error on every rank alike
// when they differ (or a rank's K and V rows do).
inline layout agree(MPI_Comm comm, const char* what, const form_facts& mine, std::uint64_t v_rows) {
  layout l;
  MPI_Comm_rank(comm, &l.rank);
  MPI_Comm_size(comm, &l.size);
  std::vector<std::uint64_t> row;
  for (const auto& [name, x] : mine.same) row.push_back(x);
  row.push_back(mine.q_rows);
  row.push_back(mine.k_rows);
  row.push_back(v_rows);
  const std::size_t w = row.size();
  std::vector<std::uint64_t> all(w * static_cast<std::size_t>(l.size));
  MPI_Allgather(row.data(), static_cast<int>(w), MPI_UINT64_T, all.data(), static_cast<int>(w), MPI_UINT64_T, comm);
  for (int r = 0; r < l.size; ++r) {
    const std::uint64_t* x = all.data() + w * static_cast<std::size_t>(r);
    for (std::size_t c = 0; c < mine.same.size(); ++c)
      if (x[c] != all[c])
        throw shape_error(std::string("qkv: ") + what + ": the ranks passed different forms: " + mine.same[c].first +
                          " is " + std::to_string(all[c]) + " on rank 0 but " + std::to_string(x[c]) + " on rank " +
                          std::to_string(r));
    const std::size_t n = mine.same.size();
    if (x[n + 1] != x[n + 2])
      throw shape_error(std::string("qkv: ") + what + ": rank " + std::to_string(r) + " holds " +
                        std::to_string(x[n + 1]) + " rows of K but " + std::to_string(x[n + 2]) + " of V");
    l.q_rows.push_back(x[n]);
    l.k_rows.push_back(x[n + 1]);
  }
  return l;
}

}  // namespace qkv::mpi::detail
