// Typed reads of JSON fields from files flashjit reads back but a person or another tool may have
// edited (bundle manifests, disk-cache metadata). nlohmann's value() throws when a field has another
// type; here such a field is an error that names it and what was expected, and reading goes on with
// the fallback so the caller checks once at the end.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace flashjit {

class JsonFields {
public:
  // Field `key` of `object`, or `fallback` when it is absent (or after an earlier error).
  template <typename T> T get(const nlohmann::json &object, const char *key, T fallback) {
    if (!error_.empty() || !object.is_object() || !object.contains(key))
      return fallback;
    const nlohmann::json &value = object.at(key);
    if constexpr (std::is_same_v<T, std::string>) {
      if (value.is_string())
        return value.get<std::string>();
      return fail(key, "a string", value, fallback);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (value.is_boolean())
        return value.get<bool>();
      return fail(key, "true or false", value, fallback);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (value.is_number())
        return value.get<T>();
      return fail(key, "a number", value, fallback);
    } else {
      static_assert(std::is_integral_v<T>, "strings, booleans and numbers");
      if (value.is_number_unsigned() && value.get<std::uint64_t>() <= std::uint64_t{std::numeric_limits<T>::max()})
        return static_cast<T>(value.get<std::uint64_t>());
      if constexpr (std::is_signed_v<T>)
        if (value.is_number_integer() && !value.is_number_unsigned() &&
            value.get<std::int64_t>() >= std::int64_t{std::numeric_limits<T>::min()} &&
            value.get<std::int64_t>() <= std::int64_t{std::numeric_limits<T>::max()})
          return static_cast<T>(value.get<std::int64_t>());
      return fail(key, std::is_signed_v<T> ? "an integer" : "an integer >= 0", value, fallback);
    }
  }
  std::string get(const nlohmann::json &object, const char *key, const char *fallback) {
    return get<std::string>(object, key, fallback);
  }

  bool ok() const { return error_.empty(); }
  // The first field that had the wrong type: "'size' should be an integer >= 0, not \"12\"".
  const std::string &error() const { return error_; }

private:
  static constexpr size_t kShownValueChars = 40;

  template <typename T> T fail(const char *key, const char *expected, const nlohmann::json &value, T fallback) {
    std::string shown = value.dump();
    if (shown.size() > kShownValueChars)
      shown = shown.substr(0, kShownValueChars) + "...";
    error_ = std::string("'") + key + "' should be " + expected + ", not " + shown;
    return fallback;
  }

  std::string error_;
};

} // namespace flashjit
