// Expressions on paged K and V (storage/paged_view.hpp). The strategies
// reach an operand one matrix at a time, and a sequence's keys in pages are
// not one matrix: each evaluation first copies every paged operand's
// sequences, token-major, into one contiguous block (gather_pages), and
// evaluates the same expression on it, so that the result is by
// construction the expression over each sequence's keys gathered into a
// contiguous tensor. (The copy is one more pass over K and V; reading the
// pages in place in the kernels is what would remove it.)
#pragma once

#include "../expr/node.hpp"
#include "../storage/matrix_view.hpp"
#include "../storage/paged_view.hpp"
#include "../storage/ragged.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkv::detail {

template <class E>
concept paged_leaf = tensor_leaf<E> && requires { requires std::remove_cvref_t<E>::qkv_paged; };

// Whether e reads a paged operand.
template <class E>
constexpr bool reads_pages() {
  if constexpr (paged_leaf<E>) {
    return true;
  } else if constexpr (leaf<E> || tensor_leaf<E>) {
    return false;
  } else {
    using ops = decltype(std::declval<const E&>().operands());
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (reads_pages<bare_t<std::tuple_element_t<I, ops>>>() || ... || false);
    }(std::make_index_sequence<std::tuple_size_v<ops>>{});
  }
}

// A paged operand's sequences, copied end to end: a batch of {B, H}
// matrices like the paged one's (not a ragged result: the rows of e's
// result are its queries').
template <class T, std::size_t H, std::size_t D>
class gathered_pages {
 public:
  using value_type = T;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_tensor = true;
  static constexpr bool qkv_is_view = false;
  static constexpr std::size_t static_rank = 4;
  static constexpr std::size_t static_rows = dyn;
  static constexpr std::size_t static_cols = D;
  static constexpr std::size_t static_heads = H;
  static constexpr batch_extents static_batch{dyn, H};

  template <class P>
  explicit gathered_pages(const P& p) : offsets_{0} {
    for (std::size_t b = 0; b < p.batch(); ++b) offsets_.push_back(offsets_.back() + static_cast<std::int32_t>(p.length(b)));
    copy_ = ragged<T, H, D>(offsets_, {p.heads(), p.cols()});
    T* to = copy_.data();
    const std::size_t d = p.cols();
    for (std::size_t b = 0; b < p.batch(); ++b)
      for (std::size_t t = 0; t < p.length(b); ++t)
        for (std::size_t h = 0; h < p.heads(); ++h, to += d) std::memcpy(to, p.row(b, t, h), d * sizeof(T));
  }

  batch_extents batch() const noexcept { return {copy_.batch(), copy_.heads()}; }
  matrix_view<const T, dyn, D> batch_matrix(batch_extents b) const { return copy_.batch_matrix(b); }
  std::size_t rows() const noexcept { return copy_.rows(); }
  std::size_t cols() const noexcept { return copy_.cols(); }
  std::size_t extent(std::size_t k) const { return copy_.extent(k); }
  std::size_t stride(std::size_t k) const { return copy_.stride(k); }
  const T* data() const noexcept { return copy_.data(); }

 private:
  std::vector<std::int32_t> offsets_;
  ragged<T, H, D> copy_;
};

// e with each paged operand replaced by its gathered copy; e itself (a
// reference) where it reads none.
template <class E>
decltype(auto) gather_pages(const E& e) {
  if constexpr (!reads_pages<E>()) {
    return (e);
  } else if constexpr (paged_leaf<E>) {
    return gathered_pages<value_type_t<E>, E::static_heads, E::static_cols>(e);
  } else {
    return std::apply([&](const auto&... x) { return e.rebuild(gather_pages(x)...); }, e.operands());
  }
}

}  // namespace qkv::detail
