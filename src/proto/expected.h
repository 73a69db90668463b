// A value or a typed error, for code whose callers branch on *why* something failed (a timeout is retried,
// a closed peer is reconnected, a malformed frame drops the connection). core/status.h carries only a
// message; this carries an error struct chosen by the layer (proto::ProtoError, net::NetError).
//
//   Expected<Frame, ProtoError> r = decode(...);
//   if (!r) return r.error();                  // r.error().kind, r.error().message
//   use(*r);
//
//   Expected<void, ProtoError> ok = {};        // success without a value
//
// Errors convert to a core Status (error().status()) where an upper layer only needs the message.
#pragma once

#include <type_traits>
#include <utility>
#include <variant>

#include "core/status.h"

namespace essaim::proto {

// Tag that marks a constructor argument as the error alternative (like std::unexpected).
template <typename E>
struct Unexpected {
  E error;
};
template <typename E>
Unexpected<std::decay_t<E>> unexpected(E&& e) {
  return {std::forward<E>(e)};
}

template <typename T, typename E>
class [[nodiscard]] Expected {
 public:
  Expected() requires std::is_default_constructible_v<T> : v_(std::in_place_index<0>) {}
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Expected(E error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT
  Expected(Unexpected<E> u) : v_(std::in_place_index<1>, std::move(u.error)) {}  // NOLINT

  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const E& error() const { return std::get<1>(v_); }
  Status status() const { return is_ok() ? Status::ok() : error().status(); }

 private:
  std::variant<T, E> v_;
};

// Success without a value: Expected<void, E> holds std::monostate.
template <typename E>
class [[nodiscard]] Expected<void, E> {
 public:
  Expected() = default;
  Expected(E error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT
  Expected(Unexpected<E> u) : v_(std::in_place_index<1>, std::move(u.error)) {}  // NOLINT

  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }
  const E& error() const { return std::get<1>(v_); }
  Status status() const { return is_ok() ? Status::ok() : error().status(); }

 private:
  std::variant<std::monostate, E> v_;
};

}  // namespace essaim::proto
