// Expressions on paged K and V (storage/paged_view.hpp). An attention whose
// scores are the dot product of Q and a paged K, over a paged V of the same
// storage, is evaluated with K and V in their pages (pages_in_place): each
// sequence's keys of a head are a paged_matrix, which the kernels' decode
// parts read in place and their query blocks copy contiguous once, as they
// pack them anyway (kernels/paged_kv.hpp). Any other expression, and the
// node-by-node strategy, get every paged operand's sequences copied end to
// end first (gather_operands, plain_operands.hpp). Either way the result is the same expression
// over each sequence's keys gathered into a contiguous tensor.
#pragma once

#include "../expr/node.hpp"
#include "fused.hpp"
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

template <class L>
struct is_paged_leaf : std::bool_constant<paged_leaf<L>> {};

// Whether e reads a paged operand.
template <class E>
constexpr bool reads_pages() {
  return reads_leaf<is_paged_leaf, E>();
}

// Whether the best strategy reads e's paged K and V in place.
template <class E>
inline constexpr bool pages_in_place = [] {
  if constexpr (!has_fused_form<E>) {
    return false;
  } else {
    using chain = score_chain<typename fused_form<bare_t<E>>::scores>;
    using keys = std::remove_cv_t<std::remove_pointer_t<decltype(chain::keys_of(nullptr))>>;
    using values = bare_t<decltype(std::declval<const bare_t<E>&>().rhs())>;
    if constexpr (std::is_void_v<keys>) {
      return false;  // not the dot product's scores (the keys' norms, a user's term: read as stored rows)
    } else if constexpr (!paged_leaf<bare_t<keys>> || !paged_leaf<values>) {
      return false;
    } else {
      using S = std::remove_const_t<value_type_t<bare_t<keys>>>;
      return std::is_same_v<S, std::remove_const_t<value_type_t<values>>> && std::is_same_v<kv_storage_t<bare_t<E>>, S>;
    }
  }
}();

// Whether Policy's evaluation of e first gathers its pages.
template <class Policy, class E>
inline constexpr bool gathers_pages = reads_pages<bare_t<E>>() && !(std::is_same_v<Policy, best_policy> && pages_in_place<E>);

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

}  // namespace qkv::detail
