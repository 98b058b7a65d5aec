// quantized<F, X>: the values of a float matrix, tensor or ragged X in the
// format F (q8 or q4, numeric/quantized_format.hpp), owning, 64-byte
// aligned. X's rows (its last extent, d, a multiple of 32) are quantized
// one by one and laid out one after another in X's row-major order, each
// F::row_bytes(d) bytes:
//   quantize<q8>(X) / quantize<q4>(X)   from a float, bf16 or f16 matrix,
//                                       tensor or ragged, or a view of one
//   dequantize(Xq)                      the X of the values Xq stands for
// Xq keeps X's extents (and offsets) and reads them as X does: Xq.rows(),
// Xq.extents(), Xq.batch(), Xq.length(b), ...; Xq(i, c) (and the index
// forms of X) is one value, dequantized. Xq is an operand of expressions as
// X is (K or V of an attention: eval/plain_operands.hpp).
#pragma once

#include "../numeric/quantized_format.hpp"
#include "../shape/batch.hpp"
#include "../shape/shape_error.hpp"
#include "aligned_buffer.hpp"
#include "../expr/expression.hpp"
#include "matrix.hpp"
#include "matrix_view.hpp"
#include "owning.hpp"
#include "ragged.hpp"
#include "ragged_view.hpp"
#include "tensor.hpp"
#include "tensor_view.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkv {

namespace detail {

// What quantize takes: a matrix, tensor or ragged, or a view of one, of
// float, bf16 or f16.
template <class X>
concept quantizable = (leaf<X> || (tensor_leaf<X> && !requires { X::qkv_paged; })) && !coded_leaf<X>;

template <class X>
inline constexpr bool quantizable_element =
    std::is_same_v<X, float> || std::is_same_v<X, bf16> || std::is_same_v<X, f16>;

// X's shape without its values: its extents (and offsets), the number of
// its rows, and which row an index names.
template <class X>
class quantized_shape;

template <std::size_t R, std::size_t C>
class quantized_shape<matrix<float, R, C>> {
 public:
  static constexpr std::size_t static_rows = R;
  static constexpr std::size_t static_cols = C;
  template <class M>
  explicit quantized_shape(const M& m) : rows_(m.rows()), cols_(m.cols()) {}
  std::size_t rows() const noexcept { return rows_; }
  std::size_t cols() const noexcept { return cols_; }
  std::size_t row_count() const noexcept { return rows_; }
  std::size_t row_of(std::size_t i) const noexcept { return i; }
  matrix<float, R, C> make() const { return matrix<float, R, C>(rows_, cols_); }
  template <class M, class Fn>
  static void each_row(const M& m, Fn&& row) {
    for (std::size_t i = 0; i < m.rows(); ++i) row(i, [&](std::size_t c) { return m(i, c); });
  }

 private:
  std::size_t rows_, cols_;
};

template <std::size_t... E>
class quantized_shape<tensor<float, E...>> {
  using holder = tensor<float, E...>;
  static constexpr std::size_t rank = sizeof...(E);

 public:
  using extents_type = typename holder::extents_type;
  static constexpr bool qkv_tensor = true;
  static constexpr std::size_t static_rank = holder::static_rank;
  static constexpr std::size_t static_rows = holder::static_rows;
  static constexpr std::size_t static_cols = holder::static_cols;
  static constexpr batch_extents static_batch = holder::static_batch;
  template <class X>
  explicit quantized_shape(const X& x) {
    for (std::size_t k = 0; k < rank; ++k) extents_[k] = x.extent(k);
  }
  const extents_type& extents() const noexcept { return extents_; }
  std::size_t extent(std::size_t k) const { return extents_.at(k); }
  std::size_t rows() const noexcept { return extents_[rank - 2]; }
  batch_extents batch() const noexcept { return rank == 4 ? batch_extents{extents_[0], extents_[1]} : batch_extents{1, extents_[0]}; }
  std::size_t cols() const noexcept { return extents_[rank - 1]; }
  std::size_t row_count() const noexcept {
    std::size_t n = 1;
    for (std::size_t k = 0; k + 1 < rank; ++k) n *= extents_[k];
    return n;
  }
  template <class... I>
  std::size_t row_of(I... index) const noexcept {
    const std::array<std::size_t, rank - 1> at{static_cast<std::size_t>(index)...};
    std::size_t r = 0;
    for (std::size_t k = 0; k + 1 < rank; ++k) r = r * extents_[k] + at[k];
    return r;
  }
  holder make() const { return holder(extents_); }
  template <class X, class Fn>
  static void each_row(const X& x, Fn&& row) {
    const quantized_shape s(x);
    std::array<std::size_t, rank> at{};
    for (std::size_t r = 0; r < s.row_count(); ++r) {
      std::size_t left = r;
      for (std::size_t k = rank - 1; k-- > 0;) at[k] = left % s.extents_[k], left /= s.extents_[k];
      row(r, [&](std::size_t c) {
        at[rank - 1] = c;
        return std::apply([&](auto... i) { return x(i...); }, at);
      });
    }
  }

 private:
  extents_type extents_{};
};

template <std::size_t H, std::size_t D>
class quantized_shape<ragged<float, H, D>> {
 public:
  static constexpr bool qkv_tensor = true;
  static constexpr bool qkv_ragged = true;
  static constexpr std::size_t static_rank = 4;
  static constexpr std::size_t static_rows = dyn;
  static constexpr std::size_t static_cols = D;
  static constexpr std::size_t static_heads = H;
  static constexpr batch_extents static_batch{dyn, H};
  template <class X>
  explicit quantized_shape(const X& x) : offsets_(x.offsets().begin(), x.offsets().end()), extents_{x.heads(), x.cols()} {}
  std::size_t batch() const noexcept { return offsets_.size() - 1; }
  std::size_t length(std::size_t b) const { return static_cast<std::size_t>(offsets_.at(b + 1) - offsets_.at(b)); }
  std::span<const std::int32_t> offsets() const noexcept { return offsets_; }
  std::size_t heads() const noexcept { return extents_[0]; }
  std::size_t tokens() const noexcept { return static_cast<std::size_t>(offsets_.back()); }
  std::size_t rows() const noexcept { return tokens(); }
  std::size_t cols() const noexcept { return extents_[1]; }
  std::size_t row_count() const noexcept { return tokens() * heads(); }
  std::size_t row_of(std::size_t t, std::size_t h) const noexcept { return t * heads() + h; }
  ragged<float, H, D> make() const { return ragged<float, H, D>(offsets_, extents_); }
  template <class X, class Fn>
  static void each_row(const X& x, Fn&& row) {
    const std::size_t heads = x.heads();
    for (std::size_t t = 0; t < x.tokens(); ++t)
      for (std::size_t h = 0; h < heads; ++h) row(t * heads + h, [&](std::size_t c) { return x(t, h, c); });
  }

 private:
  std::vector<std::int32_t> offsets_;
  ragged_extents extents_;
};

}  // namespace detail

template <class F, class X>
class quantized : public detail::quantized_shape<X> {
  static_assert(quantized_format<F>, "qkv: quantized<F, X> needs F = q8 or q4");
  static_assert(X::static_cols == dyn || X::static_cols % F::group == 0,
                "qkv: a quantized row holds groups of 32 values: the last extent must be a multiple of 32");
  using shape = detail::quantized_shape<X>;

 public:
  using format = F;
  using float_type = X;
  // An operand of expressions: the float values it stands for.
  using value_type = float;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_quantized = true;
  static constexpr bool qkv_is_view = false;

  // The values of x (float, bf16 or f16, of X's kind) quantized row by row.
  template <class Source>
  explicit quantized(const Source& x) : shape(x) {
    if (this->cols() % F::group != 0)
      throw shape_error(std::string("qkv: quantize<") + F::name + ">: rows of " + std::to_string(this->cols()) +
                        " values, not a multiple of 32");
    buf_ = detail::aligned_buffer<std::byte>(this->row_count() * row_bytes());
    std::vector<float> values(this->cols());
    shape::each_row(x, [&](std::size_t r, auto at) {
      for (std::size_t c = 0; c < values.size(); ++c) values[c] = static_cast<float>(at(c));
      F::quantize_row(values.data(), values.size(), row(r));
    });
  }

  // Bytes of one row, of the whole.
  std::size_t row_bytes() const noexcept { return F::row_bytes(this->cols()); }
  std::size_t bytes() const noexcept { return buf_.size(); }
  std::byte* data() noexcept { return buf_.data(); }
  const std::byte* data() const noexcept { return buf_.data(); }
  std::byte* row(std::size_t r) noexcept { return buf_.data() + r * row_bytes(); }
  const std::byte* row(std::size_t r) const noexcept { return buf_.data() + r * row_bytes(); }

  // One value, by X's index: (i, c) of a matrix, (b, h, i, c) of a rank-4
  // tensor, (t, h, c) of a ragged.
  template <class... I>
  float operator()(I... index) const noexcept {
    const std::array<std::size_t, sizeof...(I)> at{static_cast<std::size_t>(index)...};
    return value_at(at, std::make_index_sequence<sizeof...(I) - 1>{});
  }

 private:
  template <std::size_t N, std::size_t... K>
  float value_at(const std::array<std::size_t, N>& at, std::index_sequence<K...>) const noexcept {
    return F::value(row(this->row_of(at[K]...)), this->cols(), at[N - 1]);
  }

  detail::aligned_buffer<std::byte> buf_;
};

// X's values in the format F (q8 or q4).
template <class F, class X>
  requires(quantized_format<F> && detail::quantizable<X>)
auto quantize(const X& x) {
  static_assert(detail::quantizable_element<std::remove_const_t<value_type_t<X>>>,
                "qkv: quantize takes float, bf16 or f16 values");
  return quantized<F, detail::owning_t<X, float>>(x);
}

// The float values xq stands for, in the holder it was quantized from.
template <class F, class X>
X dequantize(const quantized<F, X>& xq) {
  X out = xq.make();  // row-major and contiguous: row r at r · d
  const std::size_t d = xq.cols();
  for (std::size_t r = 0; r < xq.row_count(); ++r)
    for (std::size_t c = 0; c < d; ++c) out.data()[r * d + c] = F::value(xq.row(r), d, c);
  return out;
}

}  // namespace qkv
