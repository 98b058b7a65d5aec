// The exception for dynamic extents that disagree.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace qkv {

class shape_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

inline std::string shape_string(std::size_t rows, std::size_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

}  // namespace detail
}  // namespace qkv
