// The device templates, embedded at build time (cmake/EmbedTemplates.cmake).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace flashjit {

struct EmbeddedTemplate {
  std::string_view path; // relative to templates/, as written in #include "..."
  std::string_view text;
};

const std::vector<EmbeddedTemplate> &embedded_templates();
// xxh64 over every path and text: part of every cache key.
uint64_t templates_hash();

} // namespace flashjit
