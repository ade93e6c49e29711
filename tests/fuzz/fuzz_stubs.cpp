// Link stubs of the fuzz target: structured_request.cpp's check_structured_outputs calls the engine's constraint
// validation (xgrammar, src/engine/structured_output.cpp), which the request parser under fuzzing never reaches and
// this standalone target does not build. A call would be a harness bug: it aborts.
#include <cstdlib>

#include "engine/structured_output.h"

namespace ssmserve {
void validate_structured_outputs(const StructuredOutputsParams&) { std::abort(); }
}  // namespace ssmserve
