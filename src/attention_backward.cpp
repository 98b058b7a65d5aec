// The fused backward of kernels/api.hpp on the instruction set that runs.
// One thread computes every tile once (groups of key blocks, dQ on the
// way); more threads split the work in two passes that need no atomics, key
// groups (dK, dV) then query blocks (dQ), each computing its tiles as the single
// thread does, in the same order: the results are the same bits. Many
// problems at once go one a thread, each in one pass.
#include "kernel_table.hpp"

#include <qkv/kernels/api.hpp>
#include <qkv/kernels/attention_schedule.hpp>
#include <qkv/kernels/parallel.hpp>
#include <qkv/storage/aligned_buffer.hpp>

#include <cstddef>

namespace qkv::kernels {
namespace {

// A tile's buffers, the calling thread's own (slot 3: the forward's
// scheduler uses 0 to 2).
template <class T>
T* thread_scratch(std::size_t elements) {
  return schedule_detail::thread_buffer<T, 3>(elements);
}

// One problem: on one thread when `alone` or when it has one group of keys,
// else spread over the threads.
template <class T>
void backward_one(const backward_entries<T>& k, const attention_problem<T>& p, const attention_gradient<T>& g,
                  bool alone) {
  const std::size_t n = p.q.rows, m = p.k.rows;
  detail::aligned_buffer<T> shared(k.shared_size(n, m, p.q.cols, p.v.cols), detail::aligned_buffer<T>::uninitialized);
  k.prepare(p, g, shared.data());
  const std::size_t key_groups = k.key_groups(m, p.q.cols, p.v.cols), query_blocks = k.query_blocks(n);
  if (alone || threads() == 1 || key_groups < 2) {
    T* scratch = thread_scratch<T>(k.scratch_size());
    for (std::size_t b = 0; b < key_groups; ++b) k.key_group(p, g, shared.data(), b, scratch, true);
  } else {
    detail::parallel_for(key_groups, [&](std::size_t b) {
      k.key_group(p, g, shared.data(), b, thread_scratch<T>(k.scratch_size()), false);
    });
    detail::parallel_for(query_blocks, [&](std::size_t b) {
      k.query_block(p, g, shared.data(), b, thread_scratch<T>(k.scratch_size()));
    });
  }
  k.finish(p, g, shared.data());
}

// Many problems (the heads of a layer): with at least as many as threads,
// each on one thread; else one by one, each spread over the threads.
template <class T>
void backward_impl(const attention_problem<T>* p, const attention_gradient<T>* g, std::size_t count) {
  const backward_entries<T>& k = active_kernels<T>().backward;
  if (count >= 2 && count >= threads()) {
    detail::parallel_for(count, [&](std::size_t x) { backward_one(k, p[x], g[x], true); });
  } else {
    for (std::size_t x = 0; x < count; ++x) backward_one(k, p[x], g[x], false);
  }
}

}  // namespace

void attention_backward(const attention_problem<float>& p, const attention_gradient<float>& g) {
  backward_impl(&p, &g, 1);
}
void attention_backward(const attention_problem<double>& p, const attention_gradient<double>& g) {
  backward_impl(&p, &g, 1);
}
void attention_backward(const attention_problem<float>* p, const attention_gradient<float>* g, std::size_t count) {
  backward_impl(p, g, count);
}
void attention_backward(const attention_problem<double>* p, const attention_gradient<double>* g, std::size_t count) {
  backward_impl(p, g, count);
}

}  // namespace qkv::kernels
