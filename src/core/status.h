// Error values for everything that touches untrusted input (STYLE.md rule 4).
//
//   Result<Header> r = parse(bytes);
//   if (!r) return r.status();            // or: ESSAIM_ASSIGN_OR_RETURN(auto h, parse(bytes));
//   use(*r);
//
// A broken *internal* invariant is not an error value: ESSAIM_CHECK stays on in release builds and aborts
// with the condition and location. It must never be reachable from user input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace essaim {

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message), true); }
  // An error that asking again the same way cannot cure (the peer refused the request, its certificate does
  // not verify): code that retries stops at permanent() instead of matching the message.
  static Status refusal(std::string message) {
    Status s(std::move(message), true);
    s.permanent_ = true;
    return s;
  }

  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }
  bool permanent() const { return permanent_; }

  // Prefixes context ("reading tensor 'x': ") to an error; no-op on success.
  Status with_context(const std::string& context) const {
    if (!failed_) return *this;
    Status s(context + ": " + message_, true);
    s.permanent_ = permanent_;
    return s;
  }

 private:
  Status(std::string message, bool failed) : message_(std::move(message)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
  bool permanent_ = false;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {          // NOLINT
    if (std::get<Status>(v_).is_ok()) v_ = Status::error("internal: Result built from an ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  Status status() const { return is_ok() ? Status::ok() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] inline void check_failed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "essaim: internal check failed: %s at %s:%d\n", cond, file, line);
  std::abort();
}

}  // namespace essaim

#define ESSAIM_CHECK(cond) \
  ((cond) ? (void)0 : ::essaim::check_failed(#cond, __FILE__, __LINE__))

#define ESSAIM_CONCAT_INNER_(a, b) a##b
#define ESSAIM_CONCAT_(a, b) ESSAIM_CONCAT_INNER_(a, b)

#define ESSAIM_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::essaim::Status essaim_status_ = (expr);         \
    if (!essaim_status_.is_ok()) return essaim_status_; \
  } while (0)

#define ESSAIM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.is_ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#define ESSAIM_ASSIGN_OR_RETURN(lhs, expr) \
  ESSAIM_ASSIGN_OR_RETURN_IMPL_(ESSAIM_CONCAT_(essaim_result_, __LINE__), lhs, expr)
