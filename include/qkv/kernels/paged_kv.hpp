// K and V read in place from a paged cache (strided.hpp's page table) by
// the decode parts alone, which reach every row through strided::ptr. The
// query-block kernels pack K and V from contiguous rows: a problem they take
// gets its paged K and V copied contiguous first, once for the problems
// that share them. The copy is of one K and one V per key/value head, which
// the kernel packs anyway; its arithmetic is the same on either.
#pragma once

#include "../storage/aligned_buffer.hpp"
#include "attention_problem.hpp"

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

namespace qkv::kernels {

template <class T, class S>
bool reads_pages(const attention_problem<T, S>& p) {
  return p.k.pages != nullptr || p.v.pages != nullptr;
}

// The problems, those with paged K or V that `keeps(p)` does not keep paged
// given contiguous copies.
template <class T, class S>
struct contiguous_kv {
  std::vector<attention_problem<T, S>> problems;
  std::vector<detail::aligned_buffer<S>> kept;

  template <class Keeps>
  contiguous_kv(const attention_problem<T, S>* ps, std::size_t count, Keeps keeps) {
    std::vector<std::pair<strided<const S>, const S*>> seen;
    const auto copy = [&](const strided<const S>& x) -> strided<const S> {
      if (x.pages == nullptr) return x;
      for (const auto& [from, to] : seen)
        if (from.data == x.data && from.pages == x.pages && from.rows == x.rows && from.cols == x.cols)
          return {to, x.rows, x.cols, static_cast<std::ptrdiff_t>(x.cols), 1};
      kept.emplace_back(x.rows * x.cols, detail::aligned_buffer<S>::uninitialized);
      S* to = kept.back().data();
      for (std::size_t i = 0; i < x.rows; ++i)
        if (x.col_stride == 1) std::memcpy(to + i * x.cols, x.ptr(i, 0), x.cols * sizeof(S));
        else for (std::size_t c = 0; c < x.cols; ++c) to[i * x.cols + c] = x(i, c);
      seen.emplace_back(x, to);
      return {to, x.rows, x.cols, static_cast<std::ptrdiff_t>(x.cols), 1};
    };
    kept.reserve(2 * count);  // (no reallocation: the pointers stay)
    problems.assign(ps, ps + count);
    for (attention_problem<T, S>& p : problems)
      if (reads_pages(p) && !keeps(p)) p.k = copy(p.k), p.v = copy(p.v);
  }
};

// Whether any of the problems reads pages that `keeps` does not keep.
template <class T, class S, class Keeps>
bool copies_pages(const attention_problem<T, S>* ps, std::size_t count, Keeps keeps) {
  for (std::size_t x = 0; x < count; ++x)
    if (reads_pages(ps[x]) && !keeps(ps[x])) return true;
  return false;
}

}  // namespace qkv::kernels
