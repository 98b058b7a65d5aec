// Run-time halves of the shape checks; the compile-time halves are
// static_asserts in the nodes, on the same extents_agree.
#pragma once

#include "extent.hpp"
#include "shape_error.hpp"

#include <cstddef>
#include <string>

namespace qkv::detail {

// Throws when two extents that must be equal differ. `what` names the
// operation and the extents compared; both operands' shapes are appended.
inline void require_equal(std::size_t a, std::size_t b, const char* what, std::size_t a_rows, std::size_t a_cols,
                          std::size_t b_rows, std::size_t b_cols) {
  if (a != b) {
    throw shape_error(std::string("qkv: ") + what + " (" + shape_string(a_rows, a_cols) + " vs " +
                      shape_string(b_rows, b_cols) + ")");
  }
}

// Throws when two operands that must have one shape do not.
template <class A, class B>
void require_same_shape(const A& a, const B& b, const char* what) {
  require_equal(a.rows(), b.rows(), what, a.rows(), a.cols(), b.rows(), b.cols());
  require_equal(a.cols(), b.cols(), what, a.rows(), a.cols(), b.rows(), b.cols());
}

// Throws when a dynamic value given for an extent contradicts its static one.
inline void require_extent(std::size_t static_extent, std::size_t given, const char* what) {
  if (is_static(static_extent) && static_extent != given) {
    throw shape_error(std::string("qkv: ") + what + ": the type says " + std::to_string(static_extent) + ", got " +
                      std::to_string(given));
  }
}

}  // namespace qkv::detail
