// Owns the Python module's log output: the engine's spdlog lines (process-wide default logger) with every CLI flag they
// name respelt as the LLM(...) keyword (engine_args.h python_message: "--swap-space" -> "swap_space"), as the
// module's errors already are, written to stderr as the CLI's are (spdlog's default logger wrote to stdout), in spdlog's
// default format without colors.
#pragma once

namespace ssmserve::python {

/// Makes spdlog's default logger write through the respelling sink (its level kept). Called once at module import.
void install_respelling_logger();

}  // namespace ssmserve::python
