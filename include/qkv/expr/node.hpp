// The traits every expression node shares. Nodes only describe a
// computation; the strategies in eval/ carry it out.
#pragma once

#include "expression.hpp"

#include <cstddef>

namespace qkv::detail {

template <class V, std::size_t R, std::size_t C>
struct node {
  using value_type = V;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_is_view = false;
  static constexpr std::size_t static_rows = R;
  static constexpr std::size_t static_cols = C;
};

}  // namespace qkv::detail
