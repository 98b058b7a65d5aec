// append(cache, rows): new keys (or values) written into a paged cache,
// sequence b's rows at its positions lengths[b], lengths[b] + 1, ...
// Pages are the caller's to allocate: the block table must already name a
// page of the pool for every position written. The cache's lengths are the
// caller's too: add each sequence's new rows to them after the call (K and
// V share them).
#pragma once

#include "paged_view.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace qkv {

// rows: a ragged or ragged_view of the cache's B sequences, heads and dim,
// of the cache's element type. Everything is checked before anything is
// written (std::invalid_argument).
template <class T, std::size_t H, std::size_t D, class R>
  requires(!std::is_const_v<T> && requires { std::remove_cvref_t<R>::qkv_ragged; })
void append(const paged_view<T, H, D>& cache, const R& rows) {
  static_assert(std::is_same_v<T, typename std::remove_cvref_t<R>::value_type>,
                "qkv: append(cache, rows): rows must have the cache's element type");
  const std::string who = "qkv: append(cache, rows): ";
  if (rows.batch() != cache.batch() || rows.heads() != cache.heads() || rows.cols() != cache.cols())
    throw std::invalid_argument(who + "rows of " + std::to_string(rows.batch()) + " sequences of " +
                                std::to_string(rows.heads()) + " heads of " + std::to_string(rows.cols()) +
                                " for a cache of " + std::to_string(cache.batch()) + " of " +
                                std::to_string(cache.heads()) + " of " + std::to_string(cache.cols()));
  const auto table = cache.block_table();
  for (std::size_t b = 0; b < cache.batch(); ++b) {
    const std::size_t end = cache.length(b) + rows.length(b);
    const std::size_t used = (end + cache.page_size() - 1) / cache.page_size();
    if (used > table.cols())
      throw std::invalid_argument(who + "sequence " + std::to_string(b) + " would hold " + std::to_string(end) +
                                  " keys, beyond its table's " + std::to_string(table.cols()) + " pages");
    for (std::size_t k = cache.length(b) / cache.page_size(); k < used; ++k)
      if (table(b, k) < 0 || static_cast<std::size_t>(table(b, k)) >= cache.pages())
        throw std::invalid_argument(who + "sequence " + std::to_string(b) + " names page " + std::to_string(table(b, k)) +
                                    " (entry " + std::to_string(k) + "), outside the pool of " +
                                    std::to_string(cache.pages()));
  }
  const std::size_t d = cache.cols();
  for (std::size_t b = 0; b < cache.batch(); ++b) {
    const std::size_t t0 = static_cast<std::size_t>(rows.offsets()[b]);
    for (std::size_t i = 0; i < rows.length(b); ++i)
      for (std::size_t h = 0; h < cache.heads(); ++h)
        std::memcpy(cache.row(b, cache.length(b) + i, h), &rows(t0 + i, h, 0), d * sizeof(T));
  }
}

}  // namespace qkv
