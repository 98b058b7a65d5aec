// Forward-mode dual numbers: x + x′ε with ε² = 0, over a number or an xsimd
// batch. A functor written generically (auto parameters, the functions
// below) computes its derivative when called on duals: f(dual{x, 1}).d is
// f′(x). The backward of score_mod and of a user similarity term
// (grad/extensions.hpp) differentiates the user's functor this way,
// so that nobody writes a derivative by hand.
//
// A dual is constructible from a number (decltype(s)(30)), as a batch is,
// and mixes with numbers in arithmetic. One made from a number alone is a
// constant: its d is 0 and takes no part in the arithmetic (c·x has
// derivative c·x′, not c·x′ + x·0, which costs a multiply and an add that
// IEEE arithmetic does not let the compiler drop, and is NaN at x = ∞).
// The kernels make q a constant when they differentiate in k, and k when
// in q, so a term's derivative costs what it computes: for q·k, nothing.
// A variable is dual{x, dx}, or a default-made dual whose v and d are then
// set (setting d of a constant does not make it vary).
//
// Functions with dual overloads, found as `using std::f; f(x)` finds them
// (ADL) and as xsimd::f:
//   abs fabs sqrt cbrt exp exp2 expm1 log log2 log10 log1p sin cos tan asin
//   acos atan sinh cosh tanh erf, pow(x, p) and pow(x, y), fmin fmax fma,
//   floor ceil trunc round (slope 0); and xsimd::min, max, select.
// Comparisons compare the values (a bool, or a batch_bool for select).
// Where a function has no derivative (|x| at 0, min at a tie) it takes a
// one-sided one: abs′(0) = 0, and min and max follow the argument they pick.
#pragma once

#include <xsimd/xsimd.hpp>

#include <cmath>
#include <type_traits>

namespace qkv {
namespace detail {

template <class V>
struct dual_element {
  using type = V;
};
template <class T, class A>
struct dual_element<xsimd::batch<T, A>> {
  using type = T;
};

// c ? a : b, for a bool or a batch_bool.
template <class C, class V>
V pick(const C& c, const V& a, const V& b) {
  if constexpr (std::is_same_v<C, bool>) return c ? a : b;
  else return xsimd::select(c, a, b);
}

template <class D>
struct dual_math;

}  // namespace detail

template <class V>
struct dual {
  using value_type = V;
  using element_type = typename detail::dual_element<V>::type;

  V v;  // the value
  V d;  // its derivative

  dual() : v(element_type(0)), d(element_type(0)) {}
  dual(element_type x) : v(x), d(element_type(0)), varies_(false) {}  // a constant
  dual(const V& x) requires(!std::is_same_v<V, element_type>) : v(x), d(element_type(0)), varies_(false) {}
  dual(const V& x, const V& dx) : v(x), d(dx) {}

  // Hidden friends: found by ADL, and a number on either side converts.
  // A constant's derivative takes no part: c·x is c·x′, not c·x′ + x·0,
  // whose x·0 IEEE arithmetic does not let the compiler drop (∞·0 is NaN).
  friend dual operator+(const dual& a) { return a; }
  friend dual operator-(const dual& a) { return {-a.v, -a.d, a.varies_}; }
  friend dual operator+(const dual& a, const dual& b) {
    if (!a.varies_) return {a.v + b.v, b.d, b.varies_};
    if (!b.varies_) return {a.v + b.v, a.d, true};
    return {a.v + b.v, a.d + b.d, true};
  }
  friend dual operator-(const dual& a, const dual& b) {
    if (!b.varies_) return {a.v - b.v, a.d, a.varies_};
    if (!a.varies_) return {a.v - b.v, -b.d, true};
    return {a.v - b.v, a.d - b.d, true};
  }
  friend dual operator*(const dual& a, const dual& b) {
    if (!a.varies_ && !b.varies_) return constant(a.v * b.v);
    if (!b.varies_) return {a.v * b.v, a.d * b.v, true};
    if (!a.varies_) return {a.v * b.v, a.v * b.d, true};
    return {a.v * b.v, a.d * b.v + a.v * b.d, true};
  }
  friend dual operator/(const dual& a, const dual& b) {
    const V q = a.v / b.v;
    if (!a.varies_ && !b.varies_) return constant(q);
    if (!b.varies_) return {q, a.d / b.v, true};
    if (!a.varies_) return {q, -(q * b.d) / b.v, true};
    return {q, (a.d - q * b.d) / b.v, true};
  }
  dual& operator+=(const dual& b) { return *this = *this + b; }
  dual& operator-=(const dual& b) { return *this = *this - b; }
  dual& operator*=(const dual& b) { return *this = *this * b; }
  dual& operator/=(const dual& b) { return *this = *this / b; }

  friend auto operator<(const dual& a, const dual& b) { return a.v < b.v; }
  friend auto operator<=(const dual& a, const dual& b) { return a.v <= b.v; }
  friend auto operator>(const dual& a, const dual& b) { return a.v > b.v; }
  friend auto operator>=(const dual& a, const dual& b) { return a.v >= b.v; }
  friend auto operator==(const dual& a, const dual& b) { return a.v == b.v; }
  friend auto operator!=(const dual& a, const dual& b) { return a.v != b.v; }

  using math = detail::dual_math<dual>;
  friend dual abs(const dual& x) { return math::abs(x); }
  friend dual fabs(const dual& x) { return math::abs(x); }
  friend dual sqrt(const dual& x) { return math::sqrt(x); }
  friend dual cbrt(const dual& x) { return math::cbrt(x); }
  friend dual exp(const dual& x) { return math::exp(x); }
  friend dual exp2(const dual& x) { return math::exp2(x); }
  friend dual expm1(const dual& x) { return math::expm1(x); }
  friend dual log(const dual& x) { return math::log(x); }
  friend dual log2(const dual& x) { return math::log2(x); }
  friend dual log10(const dual& x) { return math::log10(x); }
  friend dual log1p(const dual& x) { return math::log1p(x); }
  friend dual sin(const dual& x) { return math::sin(x); }
  friend dual cos(const dual& x) { return math::cos(x); }
  friend dual tan(const dual& x) { return math::tan(x); }
  friend dual asin(const dual& x) { return math::asin(x); }
  friend dual acos(const dual& x) { return math::acos(x); }
  friend dual atan(const dual& x) { return math::atan(x); }
  friend dual sinh(const dual& x) { return math::sinh(x); }
  friend dual cosh(const dual& x) { return math::cosh(x); }
  friend dual tanh(const dual& x) { return math::tanh(x); }
  friend dual erf(const dual& x) { return math::erf(x); }
  friend dual pow(const dual& x, const element_type& p) { return math::pow(x, p); }
  friend dual pow(const dual& x, const dual& y) { return math::pow(x, y); }
  friend dual fmin(const dual& a, const dual& b) { return math::min(a, b); }
  friend dual fmax(const dual& a, const dual& b) { return math::max(a, b); }
  friend dual fma(const dual& a, const dual& b, const dual& c) { return a * b + c; }
  // Steps: slope 0 between the jumps (and at them).
  friend dual floor(const dual& x) { return math::floor(x); }
  friend dual ceil(const dual& x) { return math::ceil(x); }
  friend dual trunc(const dual& x) { return math::trunc(x); }
  friend dual round(const dual& x) { return math::round(x); }

 private:
  friend struct detail::dual_math<dual>;
  dual(const V& x, const V& dx, bool varies) : v(x), d(dx), varies_(varies) {}
  static dual constant(const V& x) { return {x, V(element_type(0)), false}; }
  // False for a constant: a dual made from a number alone, or one computed
  // from constants. Its d is then 0, and the operations leave it out.
  bool varies_ = true;
};

template <class T>
inline constexpr bool is_dual_v = false;
template <class V>
inline constexpr bool is_dual_v<dual<V>> = true;

namespace detail {

// f(x) and f′(x)·x′; each function of V is found as `using std::f; f(v)`
// finds it: std's for numbers, xsimd's for batches (ADL).
template <class V>
struct dual_math<dual<V>> {
  using D = dual<V>;
  using E = typename D::element_type;
  static constexpr E ln2 = E(0.693147180559945309417), ln10 = E(2.30258509299404568402),
                     two_over_sqrt_pi = E(1.12837916709551257390);

  // f(x) = r with derivative tangent(x′); for a constant x, a constant r
  // and tangent never called (nor the slope it would compute).
  template <class F>
  static D chain(const D& x, const V& r, F tangent) {
    if (!x.varies_) return D::constant(r);
    return {r, tangent(x.d), true};
  }

  static D abs(const D& x) {
    const V zero(E(0));
    return chain(x, pick(x.v < zero, V(-x.v), x.v),
                 [&](const V& dx) { return pick(x.v < zero, V(-dx), pick(x.v > zero, dx, zero)); });
  }
  static D sqrt(const D& x) {
    using std::sqrt;
    const V r = sqrt(x.v);
    return chain(x, r, [&](const V& dx) { return dx / (V(E(2)) * r); });
  }
  static D cbrt(const D& x) {
    using std::cbrt;
    const V r = cbrt(x.v);
    return chain(x, r, [&](const V& dx) { return dx / (V(E(3)) * r * r); });
  }
  static D exp(const D& x) {
    using std::exp;
    const V e = exp(x.v);
    return chain(x, e, [&](const V& dx) { return dx * e; });
  }
  static D exp2(const D& x) {
    using std::exp2;
    const V e = exp2(x.v);
    return chain(x, e, [&](const V& dx) { return dx * e * V(ln2); });
  }
  static D expm1(const D& x) {
    using std::exp;
    using std::expm1;
    return chain(x, expm1(x.v), [&](const V& dx) { return dx * exp(x.v); });
  }
  static D log(const D& x) {
    using std::log;
    return chain(x, log(x.v), [&](const V& dx) { return dx / x.v; });
  }
  static D log2(const D& x) {
    using std::log2;
    return chain(x, log2(x.v), [&](const V& dx) { return dx / (x.v * V(ln2)); });
  }
  static D log10(const D& x) {
    using std::log10;
    return chain(x, log10(x.v), [&](const V& dx) { return dx / (x.v * V(ln10)); });
  }
  static D log1p(const D& x) {
    using std::log1p;
    return chain(x, log1p(x.v), [&](const V& dx) { return dx / (V(E(1)) + x.v); });
  }
  static D sin(const D& x) {
    using std::cos;
    using std::sin;
    return chain(x, sin(x.v), [&](const V& dx) { return dx * cos(x.v); });
  }
  static D cos(const D& x) {
    using std::cos;
    using std::sin;
    return chain(x, cos(x.v), [&](const V& dx) { return V(-(dx * sin(x.v))); });
  }
  static D tan(const D& x) {
    using std::tan;
    const V t = tan(x.v);
    return chain(x, t, [&](const V& dx) { return dx * (V(E(1)) + t * t); });
  }
  static D asin(const D& x) {
    using std::asin;
    using std::sqrt;
    return chain(x, asin(x.v), [&](const V& dx) { return dx / sqrt(V(E(1)) - x.v * x.v); });
  }
  static D acos(const D& x) {
    using std::acos;
    using std::sqrt;
    return chain(x, acos(x.v), [&](const V& dx) { return V(-(dx / sqrt(V(E(1)) - x.v * x.v))); });
  }
  static D atan(const D& x) {
    using std::atan;
    return chain(x, atan(x.v), [&](const V& dx) { return dx / (V(E(1)) + x.v * x.v); });
  }
  static D sinh(const D& x) {
    using std::cosh;
    using std::sinh;
    return chain(x, sinh(x.v), [&](const V& dx) { return dx * cosh(x.v); });
  }
  static D cosh(const D& x) {
    using std::cosh;
    using std::sinh;
    return chain(x, cosh(x.v), [&](const V& dx) { return dx * sinh(x.v); });
  }
  static D tanh(const D& x) {
    using std::tanh;
    const V t = tanh(x.v);
    return chain(x, t, [&](const V& dx) { return dx * (V(E(1)) - t * t); });
  }
  static D erf(const D& x) {
    using std::erf;
    using std::exp;
    return chain(x, erf(x.v), [&](const V& dx) { return dx * V(two_over_sqrt_pi) * exp(-(x.v * x.v)); });
  }
  // x^p for a constant p: no log of x, which may be negative or 0.
  static D pow(const D& x, const E& p) {
    using std::pow;
    return chain(x, pow(x.v, V(p)), [&](const V& dx) { return dx * V(p) * pow(x.v, V(p - E(1))); });
  }
  static D pow(const D& x, const D& y) {
    using std::log;
    using std::pow;
    if (!y.varies_) return pow_constant(x, y.v);
    const V r = pow(x.v, y.v);
    if (!x.varies_) return {r, r * (y.d * log(x.v)), true};
    return {r, r * (y.d * log(x.v) + y.v * x.d / x.v), true};
  }
  // x^y for a y that does not vary, one per lane: as pow(x, p).
  static D pow_constant(const D& x, const V& y) {
    using std::pow;
    return chain(x, pow(x.v, y), [&](const V& dx) { return dx * y * pow(x.v, V(y - V(E(1)))); });
  }
  // Steps: slope 0 between the jumps (and at them), so a constant.
  static D floor(const D& x) {
    using std::floor;
    return D::constant(floor(x.v));
  }
  static D ceil(const D& x) {
    using std::ceil;
    return D::constant(ceil(x.v));
  }
  static D trunc(const D& x) {
    using std::trunc;
    return D::constant(trunc(x.v));
  }
  static D round(const D& x) {
    using std::round;
    return D::constant(round(x.v));
  }
  static D select(const auto& c, const D& a, const D& b) {
    return {pick(c, a.v, b.v), pick(c, a.d, b.d), a.varies_ || b.varies_};
  }
  static D min(const D& a, const D& b) { return select(b.v < a.v, b, a); }
  static D max(const D& a, const D& b) { return select(a.v < b.v, b, a); }
};

}  // namespace detail
}  // namespace qkv

// The same functions as xsimd::f, which is how generic functors name them
// for batches (docs/extending.md: -xsimd::abs(q - k), xsimd::select).
namespace xsimd {

template <class V> using qkv_dual_math = qkv::detail::dual_math<qkv::dual<V>>;

template <class V> qkv::dual<V> abs(const qkv::dual<V>& x) { return qkv_dual_math<V>::abs(x); }
template <class V> qkv::dual<V> fabs(const qkv::dual<V>& x) { return qkv_dual_math<V>::abs(x); }
template <class V> qkv::dual<V> sqrt(const qkv::dual<V>& x) { return qkv_dual_math<V>::sqrt(x); }
template <class V> qkv::dual<V> cbrt(const qkv::dual<V>& x) { return qkv_dual_math<V>::cbrt(x); }
template <class V> qkv::dual<V> exp(const qkv::dual<V>& x) { return qkv_dual_math<V>::exp(x); }
template <class V> qkv::dual<V> exp2(const qkv::dual<V>& x) { return qkv_dual_math<V>::exp2(x); }
template <class V> qkv::dual<V> expm1(const qkv::dual<V>& x) { return qkv_dual_math<V>::expm1(x); }
template <class V> qkv::dual<V> log(const qkv::dual<V>& x) { return qkv_dual_math<V>::log(x); }
template <class V> qkv::dual<V> log2(const qkv::dual<V>& x) { return qkv_dual_math<V>::log2(x); }
template <class V> qkv::dual<V> log10(const qkv::dual<V>& x) { return qkv_dual_math<V>::log10(x); }
template <class V> qkv::dual<V> log1p(const qkv::dual<V>& x) { return qkv_dual_math<V>::log1p(x); }
template <class V> qkv::dual<V> sin(const qkv::dual<V>& x) { return qkv_dual_math<V>::sin(x); }
template <class V> qkv::dual<V> cos(const qkv::dual<V>& x) { return qkv_dual_math<V>::cos(x); }
template <class V> qkv::dual<V> tan(const qkv::dual<V>& x) { return qkv_dual_math<V>::tan(x); }
template <class V> qkv::dual<V> asin(const qkv::dual<V>& x) { return qkv_dual_math<V>::asin(x); }
template <class V> qkv::dual<V> acos(const qkv::dual<V>& x) { return qkv_dual_math<V>::acos(x); }
template <class V> qkv::dual<V> atan(const qkv::dual<V>& x) { return qkv_dual_math<V>::atan(x); }
template <class V> qkv::dual<V> sinh(const qkv::dual<V>& x) { return qkv_dual_math<V>::sinh(x); }
template <class V> qkv::dual<V> cosh(const qkv::dual<V>& x) { return qkv_dual_math<V>::cosh(x); }
template <class V> qkv::dual<V> tanh(const qkv::dual<V>& x) { return qkv_dual_math<V>::tanh(x); }
template <class V> qkv::dual<V> erf(const qkv::dual<V>& x) { return qkv_dual_math<V>::erf(x); }
template <class V> qkv::dual<V> pow(const qkv::dual<V>& x, const qkv::dual<V>& y) { return qkv_dual_math<V>::pow(x, y); }
template <class V> qkv::dual<V> min(const qkv::dual<V>& a, const qkv::dual<V>& b) { return qkv_dual_math<V>::min(a, b); }
template <class V> qkv::dual<V> max(const qkv::dual<V>& a, const qkv::dual<V>& b) { return qkv_dual_math<V>::max(a, b); }
template <class V> qkv::dual<V> fmin(const qkv::dual<V>& a, const qkv::dual<V>& b) { return qkv_dual_math<V>::min(a, b); }
template <class V> qkv::dual<V> fmax(const qkv::dual<V>& a, const qkv::dual<V>& b) { return qkv_dual_math<V>::max(a, b); }
template <class V> qkv::dual<V> floor(const qkv::dual<V>& x) { return qkv_dual_math<V>::floor(x); }
template <class V> qkv::dual<V> ceil(const qkv::dual<V>& x) { return qkv_dual_math<V>::ceil(x); }
template <class V> qkv::dual<V> trunc(const qkv::dual<V>& x) { return qkv_dual_math<V>::trunc(x); }
template <class V> qkv::dual<V> round(const qkv::dual<V>& x) { return qkv_dual_math<V>::round(x); }
template <class V> qkv::dual<V> fma(const qkv::dual<V>& a, const qkv::dual<V>& b, const qkv::dual<V>& c) { return a * b + c; }
template <class T, class A>
qkv::dual<batch<T, A>> select(const batch_bool<T, A>& c, const qkv::dual<batch<T, A>>& a, const qkv::dual<batch<T, A>>& b) {
  return qkv_dual_math<batch<T, A>>::select(c, a, b);
}
template <class V> qkv::dual<V> select(bool c, const qkv::dual<V>& a, const qkv::dual<V>& b) { return c ? a : b; }

}  // namespace xsimd
