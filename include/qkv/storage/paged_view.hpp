// paged_view<T, H, D>: the K or V cache of B sequences in fixed-size pages,
// as serving engines keep it (vLLM's PagedAttention): a pool of pages
// [pages, page_size, heads, dim], row-major, a block table of B rows of page
// numbers and B lengths; key t of sequence b is row t % page_size of page
// block_table(b, t / page_size). Everything the view will read is checked
// where it is made: a page number outside the pool, a length beyond the
// table, or a table and lengths of different B throw
// std::invalid_argument; rows past a length and unused table entries are
// never read. As an operand it is a batch of {B, H} matrices, sequence b's
// keys of head h (eval/pages.hpp). The pool, table and lengths must outlive
// the view, and the table and lengths must not change while it is used: a
// view is checked, and sums the lengths, when it is made.
#pragma once

#include "../expr/expression.hpp"
#include "../shape/batch.hpp"
#include "../shape/check.hpp"
#include "matrix_view.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace qkv {

// {pages, page_size, heads, dim} of a page pool.
using paged_extents = std::array<std::size_t, 4>;

// Sequence b's keys of head h in a paged cache: a matrix whose row i is row
// i % page_rows of page table[i / page_rows], pages page_stride elements
// apart from data (which is page 0's first row of head h), rows
// row_stride apart within a page. What a slice of a paged_view is
// (eval/slice.hpp), read in place by the kernels' decode parts.
template <class T, std::size_t D>
class paged_matrix {
 public:
  using value_type = std::remove_const_t<T>;
  using element_type = T;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_is_view = true;
  static constexpr std::size_t static_rows = dyn;
  static constexpr std::size_t static_cols = D;

  paged_matrix(T* data, std::size_t rows, std::size_t cols, std::size_t row_stride, const std::int32_t* table,
               std::size_t page_rows, std::size_t page_stride) noexcept
      : data_(data), rows_(rows), cols_(cols), row_stride_(row_stride), table_(table), page_rows_(page_rows),
        page_stride_(page_stride) {}

  T* row(std::size_t i) const noexcept {
    return data_ + static_cast<std::size_t>(table_[i / page_rows_]) * page_stride_ + (i % page_rows_) * row_stride_;
  }
  T& operator()(std::size_t i, std::size_t j) const noexcept { return row(i)[j]; }
  std::size_t rows() const noexcept { return rows_; }
  std::size_t cols() const noexcept { return cols_; }
  std::size_t row_stride() const noexcept { return row_stride_; }  // within a page
  T* data() const noexcept { return data_; }
  const std::int32_t* page_table() const noexcept { return table_; }
  std::size_t page_rows() const noexcept { return page_rows_; }
  std::size_t page_stride() const noexcept { return page_stride_; }

 private:
  T* data_;
  std::size_t rows_, cols_, row_stride_;
  const std::int32_t* table_;
  std::size_t page_rows_, page_stride_;
};

template <class T, std::size_t H, std::size_t D>
class paged_view {
  using bare = std::remove_const_t<T>;
  static_assert(value_element<bare>, "qkv: paged_view<T, H, D> needs T = float, double, bf16 or f16, optionally const");

 public:
  using value_type = bare;
  using element_type = T;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_tensor = true;
  static constexpr bool qkv_paged = true;
  static constexpr bool qkv_is_view = true;
  static constexpr std::size_t static_rank = 4;
  static constexpr std::size_t static_rows = dyn;
  static constexpr std::size_t static_cols = D;
  static constexpr std::size_t static_heads = H;
  static constexpr batch_extents static_batch{dyn, H};

  paged_view(T* pool, paged_extents extents, matrix_view<const std::int32_t, dyn, dyn> block_table,
             std::span<const std::int32_t> lengths)
      : pool_(pool), x_(extents), table_(block_table), lengths_(lengths) {
    detail::require_extent(H, x_[2], "paged_view heads");
    detail::require_extent(D, x_[3], "paged_view dim");
    const std::string who = "qkv: paged_view: ";
    if (x_[1] == 0) throw std::invalid_argument(who + "a page of 0 rows");
    if (pool == nullptr && x_[0] * x_[1] * x_[2] * x_[3] != 0) throw std::invalid_argument(who + "a null pool");
    if (table_.rows() != lengths_.size())
      throw std::invalid_argument(who + "the block table has " + std::to_string(table_.rows()) + " rows and there are " +
                                  std::to_string(lengths_.size()) + " lengths");
    for (std::size_t b = 0; b < lengths_.size(); ++b) {
      if (lengths_[b] < 0)
        throw std::invalid_argument(who + "sequence " + std::to_string(b) + " has a negative length");
      const std::size_t used = (static_cast<std::size_t>(lengths_[b]) + x_[1] - 1) / x_[1];
      if (used > table_.cols())
        throw std::invalid_argument(who + "sequence " + std::to_string(b) + " has " + std::to_string(lengths_[b]) +
                                    " keys, beyond its table's " + std::to_string(table_.cols()) + " pages of " +
                                    std::to_string(x_[1]));
      for (std::size_t k = 0; k < used; ++k) {
        const std::int32_t page = table_(b, k);
        if (page < 0 || static_cast<std::size_t>(page) >= x_[0])
          throw std::invalid_argument(who + "sequence " + std::to_string(b) + " names page " + std::to_string(page) +
                                      " (entry " + std::to_string(k) + "), outside the pool of " + std::to_string(x_[0]));
      }
    }
    for (std::size_t b = 0; b < lengths_.size(); ++b) tokens_ += static_cast<std::size_t>(lengths_[b]);
  }

  // A view of the same cache with const elements, checked again (at the
  // lengths and table as they are now).
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  paged_view(const paged_view<U, H, D>& o) : paged_view(o.data(), o.extents(), o.block_table(), o.lengths()) {}

  // The first of row t's dim values of head h in sequence b, unchecked.
  T* row(std::size_t b, std::size_t t, std::size_t h) const noexcept {
    const auto page = static_cast<std::size_t>(table_(b, t / x_[1]));
    return pool_ + ((page * x_[1] + t % x_[1]) * x_[2] + h) * x_[3];
  }
  T& operator()(std::size_t b, std::size_t t, std::size_t h, std::size_t c) const noexcept { return row(b, t, h)[c]; }
  T& at(std::size_t b, std::size_t t, std::size_t h, std::size_t c) const {
    if (b >= batch() || t >= length(b) || h >= x_[2] || c >= x_[3])
      throw std::out_of_range("qkv: paged_view index (" + std::to_string(b) + ", " + std::to_string(t) + ", " +
                              std::to_string(h) + ", " + std::to_string(c) + ") outside the cache");
    return (*this)(b, t, h, c);
  }

  // Sequence b's keys of head h, unchecked: what the strategies use.
  paged_matrix<const bare, D> batch_matrix_in_pages(batch_extents b) const noexcept {
    return {pool_ + b[1] * x_[3], length(b[0]), x_[3], x_[2] * x_[3], table_.data() + b[0] * table_.row_stride(), x_[1],
            x_[1] * x_[2] * x_[3]};
  }

  std::size_t batch() const noexcept { return lengths_.size(); }
  std::size_t length(std::size_t b) const noexcept { return static_cast<std::size_t>(lengths_[b]); }
  std::span<const std::int32_t> lengths() const noexcept { return lengths_; }
  matrix_view<const std::int32_t, dyn, dyn> block_table() const noexcept { return table_; }
  const paged_extents& extents() const noexcept { return x_; }
  std::size_t pages() const noexcept { return x_[0]; }
  std::size_t page_size() const noexcept { return x_[1]; }
  std::size_t heads() const noexcept { return x_[2]; }
  // For the nodes: every sequence's keys as rows, D columns; its batch
  // extents are {B, H} (shape/batch.hpp).
  std::size_t tokens() const noexcept { return tokens_; }
  std::size_t rows() const noexcept { return tokens_; }
  std::size_t cols() const noexcept { return x_[3]; }
  T* data() const noexcept { return pool_; }
  // The pool, for what reads every leaf alike (the memory a leaf spans).
  std::size_t extent(std::size_t k) const { return k < 2 ? 1 : k == 2 ? x_[0] * x_[1] * x_[2] : x_[3]; }
  std::size_t stride(std::size_t k) const { return k < 2 ? 0 : k == 2 ? x_[3] : 1; }

 private:
  T* pool_;
  paged_extents x_;
  matrix_view<const std::int32_t, dyn, dyn> table_;
  std::span<const std::int32_t> lengths_;
  std::size_t tokens_ = 0;
};

}  // namespace qkv
