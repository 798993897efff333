#include "compiler/embedded_templates.hpp"

#include <xxhash.h>

namespace flashjit {

uint64_t templates_hash() {
  static const uint64_t hash = [] {
    XXH64_state_t *state = XXH64_createState();
    XXH64_reset(state, 0);
    for (const EmbeddedTemplate &file : embedded_templates()) {
      XXH64_update(state, file.path.data(), file.path.size());
      XXH64_update(state, "\0", 1);
      XXH64_update(state, file.text.data(), file.text.size());
      XXH64_update(state, "\0", 1);
    }
    uint64_t digest = XXH64_digest(state);
    XXH64_freeState(state);
    return digest;
  }();
  return hash;
}

} // namespace flashjit
