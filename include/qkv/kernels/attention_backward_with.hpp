// The fused backward with an extension (a score modifier, a predicate): the
// user's functors exist only in the translation unit that uses them, so the
// backward kernel is instantiated here, for the instruction set this unit is
// compiled for (xsimd::default_arch), and spread over the library's threads
// as the compiled one is (backward_schedule.hpp): the same bits on any
// number of threads.
#pragma once

#include "attention_backward.hpp"
#include "backward_schedule.hpp"
#include "blocking.hpp"

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace qkv::kernels {

template <class T, class Ext>
struct backward_with_functors {
  using kernel = attention_backward_kernel<xsimd::default_arch, T, Ext, blocking_of<xsimd::default_arch, T>()>;
  const Ext& ext;
  std::size_t shared_size(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) const {
    if constexpr (extension_traits<Ext, T>::has_tables) return kernel::shared_size(n, m, dk, dv, ext.table_size());
    else return kernel::shared_size(n, m, dk, dv);
  }
  std::size_t scratch_size() const { return kernel::scratch_size(); }
  std::size_t query_blocks(std::size_t n) const { return kernel::query_blocks(n); }
  std::size_t key_blocks(std::size_t m) const { return kernel::key_blocks(m); }
  std::size_t group_blocks(std::size_t m, std::size_t dk, std::size_t dv) const {
    return kernel::group_blocks(m, dk, dv);
  }
  std::size_t key_groups(std::size_t m, std::size_t dk, std::size_t dv) const { return kernel::key_groups(m, dk, dv); }
  void prepare(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared) const {
    kernel::prepare(p, g, shared);
  }
  void key_group(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t kg, T* scratch,
                 bool with_dq) const {
    kernel::key_group(p, g, shared, kg, scratch, with_dq, ext);
  }
  void query_block(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t qb,
                   T* scratch) const {
    kernel::query_block(p, g, shared, qb, scratch, ext);
  }
  void finish(const attention_problem<T>& p, const attention_gradient<T>& g, const T* shared) const {
    kernel::finish(p, g, shared);
  }
};

template <class T, class Ext>
void attention_backward_with(const attention_problem<T>* problems, const attention_gradient<T>* g, std::size_t count,
                             const Ext& ext) {
  schedule_backward(backward_with_functors<T, Ext>{ext}, problems, g, count);
}

}  // namespace qkv::kernels
