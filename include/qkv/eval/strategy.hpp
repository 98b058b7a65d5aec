// The evaluation strategies a user can ask for by name.
#pragma once

namespace qkv {

// Node by node: every intermediate, the n×m score matrix among them, is
// materialised, each by its own kernel.
struct naive_t {
  explicit constexpr naive_t() = default;
};
inline constexpr naive_t naive{};

}  // namespace qkv
