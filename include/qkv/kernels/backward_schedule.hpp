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
// key_groups(m, dk, dv), prepare(p, g, shared), key_group(p, g, shared, kg,
// scratch, with_dq), query_block(p, g, shared, qb, scratch), finish(p, g, shared).
#pragma once

#include "../storage/aligned_buffer.hpp"
#include "attention_problem.hpp"
#include "attention_schedule.hpp"
#include "api.hpp"
#include "parallel.hpp"

#include <cstddef>

namespace qkv::kernels {
namespace backward_detail {

// A tile's buffers, the calling thread's own (slot 3: the forward's
// scheduler uses 0 to 2).
template <class T>
T* thread_scratch(std::size_t elements) {
  return schedule_detail::thread_buffer<T, 3>(elements);
}

// A problem's packed operands and sums, the calling thread's own and kept
// for its next backward, as the forward keeps its packed K and V: a new
// buffer each call spent a few percent of the time faulting its pages in.
template <class T>
T* thread_shared(std::size_t elements) {
  return schedule_detail::thread_buffer<T, 4>(elements);
}

// One problem: on one thread when `alone` or when it has one group of keys,
// else spread over the threads.
template <class Kernel, class T>
void backward_one(const Kernel& k, const attention_problem<T>& p, const attention_gradient<T>& g, bool alone) {
  const std::size_t n = p.q.rows, m = p.k.rows;
  T* const shared = thread_shared<T>(k.shared_size(n, m, p.q.cols, p.v.cols));
  k.prepare(p, g, shared);
  const std::size_t key_groups = k.key_groups(m, p.q.cols, p.v.cols), query_blocks = k.query_blocks(n);
  if (alone || threads() == 1 || key_groups < 2) {
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
