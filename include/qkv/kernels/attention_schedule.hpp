// How the attention of many problems (the heads of a layer, the members of a
// batch) is spread over the threads, whichever kernel computes it: the
// library's compiled kernels (src/attention_forward.cpp) or a kernel with
// the user's functors instantiated in the user's unit (attention_with.hpp).
//
// Consecutive problems with the same K and V (the query heads of one
// key/value head) form a group, packed once. With many groups (at least two
// per thread) each thread takes whole groups, packing into its own buffer;
// with few, the groups go one by one, the pieces of all of a group's
// problems (query blocks, or key parts of a decode) spread over the pool, so
// a batch of short heads still fills the threads. Either way a group's
// pieces are taken piece by piece across its problems (plan_group), so that
// what one query head reads, the next finds in cache. A piece is computed alike
// whoever runs it and finish() combines a problem's pieces in a fixed order:
// the results depend neither on the number of threads nor on the way chosen.
#pragma once

#include "../storage/thread_scratch.hpp"
#include "api.hpp"
#include "attention_problem.hpp"
#include "parallel.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace qkv::kernels {

// What the scheduler asks of a kernel, for a problem p:
//   shared_size(p)   what p packs for all its pieces (K and V); 0 for nothing
//   pack(p, shared)
//   pieces(p)        its independent pieces
//   scratch_size(p)  a piece's own buffer, on the thread that runs it
//   kept_size(p)     what its pieces leave for finish(), all together (0: nothing)
//   piece(p, shared, b, scratch, kept)
//   finish(p, kept)  after all of p's pieces
namespace schedule_detail {

template <class S>
bool same_view(const strided<const S>& a, const strided<const S>& b) {
  return a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride &&
         a.col_stride == b.col_stride && a.pages == b.pages;
}

template <class P>
bool empty(const P& p) {
  return p.q.rows == 0 || p.v.cols == 0;
}

// K and V of a group packed into the calling thread's buffer, from its first
// problem that packs anything; null when none does.
template <class Kernel, class P, class T = typename P::value_type>
const T* pack_group(const Kernel& kernel, const P* group, std::size_t count) {
  for (std::size_t x = 0; x < count; ++x) {
    const P& p = group[x];
    if (empty(p)) continue;
    const std::size_t size = kernel.shared_size(p);
    if (size == 0) continue;
    T* shared = detail::thread_scratch<T, detail::scratch_slot::packed_kv>(size);
    kernel.pack(p, shared);
    return shared;
  }
  return nullptr;
}

// The pieces of a group's problems in the order they are taken: piece b of
// every problem, then piece b + 1. The problems of a group read the same K
// and V, and a decode's piece b is one part of the keys, so the group's
// other query heads find that part in cache rather than in memory (on the
// thread that read it, or in the cache the threads share). Also where each
// problem keeps what its pieces leave, and the largest piece scratch.
struct group_plan {
  std::vector<std::pair<std::size_t, std::size_t>> pieces;  // (problem, its piece)
  std::vector<std::size_t> kept_at;
  std::size_t scratch = 0;
};

template <class Kernel, class P>
group_plan plan_group(const Kernel& kernel, const P* group, std::size_t count) {
  group_plan plan;
  plan.kept_at.assign(count + 1, 0);
  std::size_t most = 0;
  for (std::size_t x = 0; x < count; ++x) {
    const bool none = empty(group[x]);
    plan.kept_at[x + 1] = plan.kept_at[x] + (none ? 0 : kernel.kept_size(group[x]));
    if (none) continue;
    most = std::max(most, kernel.pieces(group[x]));
    plan.scratch = std::max(plan.scratch, kernel.scratch_size(group[x]));
  }
  for (std::size_t b = 0; b < most; ++b)
    for (std::size_t x = 0; x < count; ++x)
      if (!empty(group[x]) && b < kernel.pieces(group[x])) plan.pieces.emplace_back(x, b);
  return plan;
}

// A whole group on the calling thread.
template <class Kernel, class P, class T = typename P::value_type>
void run_group(const Kernel& kernel, const P* group, std::size_t count) {
  const T* shared = pack_group(kernel, group, count);
  const group_plan plan = plan_group(kernel, group, count);
  T* scratch = detail::thread_scratch<T, detail::scratch_slot::block>(plan.scratch);
  T* kept = detail::thread_scratch<T, detail::scratch_slot::kept>(plan.kept_at[count]);
  for (const auto& [x, b] : plan.pieces) kernel.piece(group[x], shared, b, scratch, kept + plan.kept_at[x]);
  for (std::size_t x = 0; x < count; ++x)
    if (!empty(group[x])) kernel.finish(group[x], kept + plan.kept_at[x]);
}

// A group packed by the caller, then its pieces spread over the pool, then
// each problem finished by the caller.
template <class Kernel, class P, class T = typename P::value_type>
void spread_group(const Kernel& kernel, const P* group, std::size_t count) {
  const T* shared = pack_group(kernel, group, count);
  const group_plan plan = plan_group(kernel, group, count);
  T* kept = detail::thread_scratch<T, detail::scratch_slot::kept>(plan.kept_at[count]);
  detail::parallel_for(plan.pieces.size(), [&](std::size_t k) {
    const auto [x, b] = plan.pieces[k];
    kernel.piece(group[x], shared, b, detail::thread_scratch<T, detail::scratch_slot::block>(plan.scratch), kept + plan.kept_at[x]);
  });
  for (std::size_t x = 0; x < count; ++x)
    if (!empty(group[x])) kernel.finish(group[x], kept + plan.kept_at[x]);
}

}  // namespace schedule_detail

// P: an attention_problem, of any element and storage types.
template <class Kernel, class P>
void schedule_attention(const Kernel& kernel, const P* problems, std::size_t count) {
  using namespace schedule_detail;
  std::vector<std::size_t> starts;  // group g: problems [starts[g], starts[g + 1])
  for (std::size_t x = 0; x < count; ++x)
    if (x == 0 || !same_view(problems[x - 1].k, problems[x].k) || !same_view(problems[x - 1].v, problems[x].v))
      starts.push_back(x);
  starts.push_back(count);
  const std::size_t groups = starts.size() - 1;
  if (groups >= 2 * threads()) {
    detail::parallel_for(groups,
                         [&](std::size_t g) { run_group(kernel, problems + starts[g], starts[g + 1] - starts[g]); });
  } else {
    for (std::size_t g = 0; g < groups; ++g) spread_group(kernel, problems + starts[g], starts[g + 1] - starts[g]);
  }
}

}  // namespace qkv::kernels
