// The fused backward of kernels/api.hpp on the instruction set that runs,
// spread over threads as kernels/backward_schedule.hpp says.
#include "kernel_table.hpp"

#include <qkv/kernels/api.hpp>
#include <qkv/kernels/backward_schedule.hpp>

#include <cstddef>

namespace qkv::kernels {
namespace {

// The active kernels' entries, as the schedule asks for them.
template <class T>
struct compiled_backward_kernel {
  const backward_entries<T>& k;
  std::size_t shared_size(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) const {
    return k.shared_size(n, m, dk, dv);
  }
  std::size_t scratch_size() const { return k.scratch_size(); }
  std::size_t query_blocks(std::size_t n) const { return k.query_blocks(n); }
  std::size_t key_blocks(std::size_t m) const { return k.key_blocks(m); }
  std::size_t group_blocks(std::size_t m, std::size_t dk, std::size_t dv) const { return k.group_blocks(m, dk, dv); }
  std::size_t key_groups(std::size_t m, std::size_t dk, std::size_t dv) const { return k.key_groups(m, dk, dv); }
  void prepare(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared) const { k.prepare(p, g, shared); }
  void key_group(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t kg, T* scratch,
                 bool with_dq) const {
    k.key_group(p, g, shared, kg, scratch, with_dq);
  }
  void query_block(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t qb,
                   T* scratch) const {
    k.query_block(p, g, shared, qb, scratch);
  }
  void finish(const attention_problem<T>& p, const attention_gradient<T>& g, const T* shared) const {
    k.finish(p, g, shared);
  }
};

template <class T>
void backward_impl(const attention_problem<T>* p, const attention_gradient<T>* g, std::size_t count) {
  schedule_backward(compiled_backward_kernel<T>{active_kernels<T>().backward}, p, g, count);
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
