// Owns the library version string.
#pragma once
namespace ssmserve {
/// ssmserve's version, "MAJOR.MINOR.PATCH".
const char* version();
}  // namespace ssmserve
