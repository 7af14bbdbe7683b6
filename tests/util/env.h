// An environment variable set for a scope (the contexts opened in it read it), then put back as it was.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace softrdma::testutil {

class ScopedEnv {
 public:
  // `value` null: the variable is left as it is.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (value == nullptr) return;
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
    set_ = true;
  }
  ~ScopedEnv() {
    if (!set_) return;
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
  bool set_ = false;
};

}  // namespace softrdma::testutil
