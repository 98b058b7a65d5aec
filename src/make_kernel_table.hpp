// Instantiates every kernel for one instruction set. Included only by the
// arch_*.cpp files, each compiled with its own -m flags.
#pragma once

#include "kernel_table.hpp"

#include <qkv/kernels/attention.hpp>
#include <qkv/kernels/elementwise.hpp>
#include <qkv/kernels/gemm.hpp>
#include <qkv/kernels/softmax.hpp>

namespace qkv::kernels {

template <class Arch, class T>
constexpr kernel_set<T> make_kernel_set() {
  using g = gemm_kernel<Arch, T>;
  using e = elementwise_kernel<Arch, T>;
  using at = attention_kernel<Arch, T>;
  return {&g::workspace,       &g::run,          &softmax_kernel<Arch, T>::run, &e::multiply,
          &e::divide,          &e::add,          &e::subtract,                  &e::copy,
          &at::block_rows,     &at::shared_size, &at::scratch_size,             &at::pack,
          &at::blocks,         &at::decode};
}

template <class Arch>
constexpr kernel_table make_kernel_table(const char* name) {
  return {name, make_kernel_set<Arch, float>(), make_kernel_set<Arch, double>()};
}

}  // namespace qkv::kernels
