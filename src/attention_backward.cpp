// The fused backward of kernels/api.hpp on the instruction set that runs.
// One thread computes every tile once (groups of key blocks, dQ on the
// way); more threads split the work in two passes that need no atomics, key
// groups (dK, dV) then query blocks (dQ), each computing its tiles as the single
// thread does, in the same order: the results are the same bits.
#include "kernel_table.hpp"

#include <qkv/kernels/api.hpp>
#include <qkv/kernels/parallel.hpp>
#include <qkv/storage/aligned_buffer.hpp>

#include <cstddef>

namespace qkv::kernels {
namespace {

template <class T>
T* thread_scratch(std::size_t elements) {
  thread_local detail::aligned_buffer<T> buffer;
  if (buffer.size() < elements) buffer = detail::aligned_buffer<T>(elements, detail::aligned_buffer<T>::uninitialized);
  return buffer.data();
}

template <class T>
void backward_impl(const attention_problem<T>& p, const attention_gradient<T>& g) {
  const backward_entries<T>& k = active_kernels<T>().backward;
  const std::size_t n = p.q.rows, m = p.k.rows;
  detail::aligned_buffer<T> shared(k.shared_size(n, m, p.q.cols, p.v.cols), detail::aligned_buffer<T>::uninitialized);
  k.prepare(p, g, shared.data());
  const std::size_t key_groups = k.key_groups(m, p.q.cols, p.v.cols), query_blocks = k.query_blocks(n);
  if (threads() == 1 || key_groups < 2) {
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

}  // namespace

void attention_backward(const attention_problem<float>& p, const attention_gradient<float>& g) { backward_impl(p, g); }
void attention_backward(const attention_problem<double>& p, const attention_gradient<double>& g) { backward_impl(p, g); }

}  // namespace qkv::kernels
