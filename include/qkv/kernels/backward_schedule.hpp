// How the fused backward (attention_backward.hpp) is spread over threads,
// for the compiled kernels (src/attention_backward.cpp) and for a kernel
// instantiated with the user's functors (attention_backward_with.hpp) alike.
// One thread computes every tile once (groups of key blocks, dQ on the
// way); more threads split the work in two passes that need no atomics, key
// groups (dK, dV) then query blocks (dQ), each computing its tiles as the
// single thread does, in the same order: the results are the same bits.
// Many problems at once go one a thread, each in one pass.
//
// Kernel: shared_size(n, m, dk, dv), scratch_size(), query_blocks(n),
// key_blocks(m), group_blocks(m, dk, dv), key_groups(m, dk, dv),
// prepare(p, g, shared), key_group(p, g, shared, kg, scratch, with_dq),
// query_block(p, g, shared, qb, scratch), finish(p, g, shared).
#pragma once

#include "../storage/aligned_buffer.hpp"
#include "attention_problem.hpp"
#include "attention_schedule.hpp"
#include "api.hpp"
#include "parallel.hpp"

#include <cstddef>

namespace qkv::kernels {
namespace backward_detail {

// A tile's buffers, the calling thread's own.
template <class T>
T* thread_scratch(std::size_t elements) {
  return detail::thread_scratch<T, detail::scratch_slot::backward_tile>(elements);
}

// A problem's packed operands and sums, the calling thread's own and kept
// for its next backward, as the forward keeps its packed K and V.
template <class T>
T* thread_shared(std::size_t elements) {
  return detail::thread_scratch<T, detail::scratch_slot::backward_shared>(elements);
}

// The busiest of t threads' share of count pieces, all of `size` but the
// last (last ≤ size), handed out in order to whichever thread is free
// first, as parallel_for does: the first count − 1 go round the threads, and
// the last to one that has had fewest.
constexpr std::size_t busiest(std::size_t count, std::size_t size, std::size_t last, std::size_t t) {
  if (count == 0) return 0;
  const std::size_t rounds = (count - 1) / t, left = (count - 1) % t;
  return left > 0 ? (rounds + 1) * size : rounds * size + last;
}

// Whether the two passes on t threads beat one pass on one thread. A pair
// of tiles costs five products in one pass, four in the key pass (dK, dV)
// and three in the query pass (dQ); each pass lasts as long as its busiest
// thread. Measured on one head, the split took 1.15–1.2 times what this
// count gives (its passes read the operands twice and wait for each other),
// so it must come below 0.83 of the one pass: at T = 256, d = 64 (key
// groups of 3 and 1 blocks) it does not, and two threads were slower than one.
constexpr bool split_pays(std::size_t key_blocks, std::size_t group_blocks, std::size_t query_blocks, std::size_t t) {
  const std::size_t groups = (key_blocks + group_blocks - 1) / group_blocks;
  const std::size_t keys = busiest(groups, group_blocks, key_blocks - (groups - 1) * group_blocks, t);
  const std::size_t queries = busiest(query_blocks, 1, 1, t);
  const double split = 4.0 * double(keys) / double(key_blocks) + 3.0 * double(queries) / double(query_blocks);
  return split < 0.83 * 5.0;
}

// One problem: on one thread when `alone` or when splitting it does not pay
// (split_pays), else spread over the threads. The choice never changes the
// results' bits.
template <class Kernel, class T>
void backward_one(const Kernel& k, const attention_problem<T>& p, const attention_gradient<T>& g, bool alone) {
  const std::size_t n = p.q.rows, m = p.k.rows;
  T* const shared = thread_shared<T>(k.shared_size(n, m, p.q.cols, p.v.cols));
  k.prepare(p, g, shared);
  const std::size_t key_groups = k.key_groups(m, p.q.cols, p.v.cols), query_blocks = k.query_blocks(n);
  const std::size_t t = threads();
  if (alone || t == 1 || key_groups < 2 ||
      !split_pays(k.key_blocks(m), k.group_blocks(m, p.q.cols, p.v.cols), query_blocks, t)) {
    T* scratch = thread_scratch<T>(k.scratch_size());
    for (std::size_t b = 0; b < key_groups; ++b) k.key_group(p, g, shared, b, scratch, true);
  } else {
    detail::parallel_for(key_groups, [&](std::size_t b) {
      k.key_group(p, g, shared, b, thread_scratch<T>(k.scratch_size()), false);
    });
    detail::parallel_for(query_blocks, [&](std::size_t b) {
      k.query_block(p, g, shared, b, thread_scratch<T>(k.scratch_size()));
    });
  }
  k.finish(p, g, shared);
}

}  // namespace backward_detail

// Many problems (the heads of a layer): with at least as many as threads,
// each on one thread; else one by one, each spread over the threads.
template <class Kernel, class T>
void schedule_backward(const Kernel& k, const attention_problem<T>* p, const attention_gradient<T>* g,
                       std::size_t count) {
  if (count >= 2 && count >= threads()) {
    detail::parallel_for(count, [&](std::size_t x) { backward_detail::backward_one(k, p[x], g[x], true); });
  } else {
    for (std::size_t x = 0; x < count; ++x) backward_detail::backward_one(k, p[x], g[x], false);
  }
}

}  // namespace qkv::kernels
