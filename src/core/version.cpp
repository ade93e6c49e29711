// Owns the library version string.
#include "core/version.h"

namespace ssmserve {
const char* version() { return "0.1.0"; }
}  // namespace ssmserve
