// Weights times values, for the node-by-node softmax(S) * V: a weight of 0
// (a key the row may not see) reads nothing of its value row, as in the
// fused kernels, so NaN or ±∞ in a padded key/value cache stays out of the
// rows that cannot see it. The matrix product would give 0·NaN = NaN.
#include <qkv/kernels/api.hpp>
#include <qkv/storage/aligned_buffer.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

namespace qkv::kernels {
namespace {

template <class T>
void weigh_impl(strided<const T> w, strided<const T> v, T* c, std::ptrdiff_t ldc) {
  std::vector<std::size_t> not_finite;
  for (std::size_t k = 0; k < v.rows; ++k)
    for (std::size_t j = 0; j < v.cols; ++j)
      if (!std::isfinite(v(k, j))) {
        not_finite.push_back(k);
        break;
      }
  if (not_finite.empty()) return gemm(w, v, c, ldc);
  // The product with those rows as zeros, then each added to the rows that weigh it.
  detail::aligned_buffer<T> clean(v.rows * v.cols, detail::aligned_buffer<T>::uninitialized);
  const strided<T> cv{clean.data(), v.rows, v.cols, static_cast<std::ptrdiff_t>(v.cols), 1};
  copy(v, cv);
  for (const std::size_t k : not_finite)
    for (std::size_t j = 0; j < v.cols; ++j) cv(k, j) = T(0);
  gemm(w, cv.as_const(), c, ldc);
  for (const std::size_t k : not_finite)
    for (std::size_t i = 0; i < w.rows; ++i) {
      const T x = w(i, k);
      if (x == T(0)) continue;
      T* row = c + static_cast<std::ptrdiff_t>(i) * ldc;
      for (std::size_t j = 0; j < v.cols; ++j) row[j] += x * v(k, j);
    }
}

}  // namespace

void weigh(strided<const float> w, strided<const float> v, float* c, std::ptrdiff_t ldc) { weigh_impl(w, v, c, ldc); }
void weigh(strided<const double> w, strided<const double> v, double* c, std::ptrdiff_t ldc) {
  weigh_impl(w, v, c, ldc);
}

}  // namespace qkv::kernels
