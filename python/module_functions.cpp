// Owns the Python module's functions beside its Engine class (see module_functions.h).
#include "module_functions.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <map>
#include <string>

#include "config/hf_hub_cache.h"
#include "core/error.h"
#include "engine_args.h"
#include "log_sink.h"

namespace py = pybind11;

namespace ssmserve::python {

void bind_module_functions(py::module_& m) {
  // SsmserveError (a ValueError): the engine's errors, with the CLI flags they name spelt as LLM(...) keywords.
  static PyObject* ssm_error = nullptr;
  ssm_error = py::register_exception<Error>(m, "SsmserveError", PyExc_ValueError).ptr();
  py::register_exception_translator([](std::exception_ptr p) {  // tried before register_exception's own
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      // Decoded leniently: a message quoting bytes that are not UTF-8 (a folder name, a broken file) must still be an
      // SsmserveError, not a UnicodeDecodeError from PyErr_SetString's strict decoding.
      const std::string msg = python_message(e.what());
      PyObject* text = PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "backslashreplace");
      if (text == nullptr) {
        PyErr_Clear();
        PyErr_SetString(ssm_error, "ssmserve error (message not decodable)");
        return;
      }
      PyErr_SetObject(ssm_error, text);
      Py_DECREF(text);
    }
  });
  check_engine_args();  // every keyword's option has a CLI spelling, so its errors can be respelt
  python::install_respelling_logger();  // and its log lines too (log_sink.h)
  // The engine's log level (spdlog's default logger, process-wide): trace, debug, info, warning (warn), error,
  // critical or off. The package sets it on import (SSMSERVE_LOG_LEVEL, default warning) and LLM(log_level=...).
  m.def(
      "set_log_level",
      [](const std::string& level) {
        static const std::map<std::string, spdlog::level::level_enum> levels{
            {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
            {"warning", spdlog::level::warn}, {"warn", spdlog::level::warn}, {"error", spdlog::level::err},
            {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
        const auto it = levels.find(level);
        if (it == levels.end())
          throw py::value_error("log level must be one of trace, debug, info, warning, error, critical, off (got '" +
                                level + "')");
        spdlog::set_level(it->second);
      },
      py::arg("level"));
  // A model given as a Hugging Face id (org/name): its snapshot in the local hub cache (config/hf_hub_cache.h);
  // anything else comes back as given. Error (SsmserveError) for an id that is not in the cache.
  m.def(
      "resolve_model_path",
      [](const std::string& model, const std::string& revision) { return resolve_model_path(model, revision).string(); },
      py::arg("model"), py::arg("revision") = "main");

}

}  // namespace ssmserve::python
