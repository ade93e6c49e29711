// Owns the Python LLM(...) engine arguments (see engine_args.h): their typed checks, the table of keywords and the
// options they set, and the respelling of engine errors as keywords.
#include "engine_args.h"

#include <limits>
#include <set>
#include <stdexcept>

#include "core/error.h"
#include "engine/engine_options.h"

namespace py = pybind11;

namespace ssmserve::python {
namespace {

/// `v`'s Python type name, for messages.
std::string type_name(const py::handle& v) { return py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>(); }

/// The TypeError of an LLM(...) keyword argument `k` whose value `v` is not `want` ("an int", ...).
py::type_error bad_engine_arg(const std::string& k, const py::handle& v, const std::string& want) {
  return py::type_error("LLM() engine argument '" + k + "' cannot be " + py::repr(v).cast<std::string>().substr(0, 100) +
                        " (" + type_name(v) + "): it must be " + want);
}

/// An int keyword argument: a Python int (or an object with __index__, e.g. numpy.int64), never a bool (True is not
/// 1 here, as in vLLM's strict config), a float or a str: TypeError naming `k`. ValueError naming `k` when it does not
/// fit in 32 bits (the engine then checks its range and names the keyword too).
int int_arg(const std::string& k, const py::handle& v) {
  if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr())) throw bad_engine_arg(k, v, "an int");
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0 || x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    throw py::value_error("LLM() engine argument '" + k + "' is out of range: " + py::repr(i).cast<std::string>().substr(0, 100) +
                          " does not fit in a 32-bit int");
  return static_cast<int>(x);
}

/// A float keyword argument: a Python float or int (or an object with __float__ / __index__), never a bool or a str:
/// TypeError naming `k`; ValueError naming `k` for an int too large for a float.
double float_arg(const std::string& k, const py::handle& v) {
  const PyNumberMethods* num = Py_TYPE(v.ptr())->tp_as_number;
  const bool numeric = PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()) || (num != nullptr && num->nb_float != nullptr);
  if (py::isinstance<py::bool_>(v) || !numeric) throw bad_engine_arg(k, v, "a float");
  const double d = PyFloat_AsDouble(v.ptr());
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error("LLM() engine argument '" + k + "' is out of range: " + py::repr(v).cast<std::string>().substr(0, 100) +
                          " is not a finite float");
  }
  return d;
}

/// A bool keyword argument: True or False only (or numpy's bool; not 0 / 1 or a str): TypeError naming `k`.
bool bool_arg(const std::string& k, const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  const py::handle t = py::type::handle_of(v);
  const std::string mod = py::str(t.attr("__module__")), name = py::str(t.attr("__name__"));
  if (mod == "numpy" && (name == "bool_" || name == "bool")) return PyObject_IsTrue(v.ptr()) == 1;
  throw bad_engine_arg(k, v, "a bool");
}

/// A str keyword argument: TypeError naming `k` for anything else.
std::string str_arg(const std::string& k, const py::handle& v) {
  if (!py::isinstance<py::str>(v)) throw bad_engine_arg(k, v, "a str");
  return v.cast<std::string>();
}

/// One LLM(...) keyword argument: its keyword, the engine option it sets (EngineOptionName::name, whose CLI flag
/// engine errors name; aliases such as num_threads set the same option) and how it is set (typed: the *_arg checks).
struct EngineArg {
  std::string_view keyword;
  std::string_view option;
  void (*set)(EngineConfig& c, const std::string& k, const py::handle& v);
};

/// Every engine argument the Python LLM / AsyncLLM passes to Engine(...) (vLLM's names, and ssmserve's own as the
/// CLI's flags).
const EngineArg kEngineArgs[] = {
    {"tokenizer", "tokenizer", [](EngineConfig& c, const std::string& k, const py::handle& v) { c.tokenizer = str_arg(k, v); }},
    {"max_num_seqs", "max_num_seqs",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.scheduler.max_num_seqs = int_arg(k, v); }},
    {"max_num_batched_tokens", "max_num_batched_tokens",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.scheduler.max_num_batched_tokens = int_arg(k, v); }},
    {"num_state_blocks", "num_state_blocks",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.num_state_blocks = int_arg(k, v); }},
    {"threads", "threads", [](EngineConfig& c, const std::string& k, const py::handle& v) { c.num_threads = int_arg(k, v); }},
    {"num_threads", "threads", [](EngineConfig& c, const std::string& k, const py::handle& v) { c.num_threads = int_arg(k, v); }},
    {"tensor_parallel_size", "tensor_parallel_size",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.tensor_parallel_size = int_arg(k, v); }},
    {"max_model_len", "max_model_len",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.max_model_len = int_arg(k, v); }},
    {"mamba_cache_dtype", "mamba_cache_dtype",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.mamba_cache_dtype = str_arg(k, v); }},
    {"mamba_ssm_cache_dtype", "mamba_ssm_cache_dtype",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.mamba_ssm_cache_dtype = str_arg(k, v); }},
    {"device", "device", [](EngineConfig& c, const std::string& k, const py::handle& v) { c.device = str_arg(k, v); }},
    {"gpu_memory_utilization", "gpu_memory_utilization",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.gpu_memory_utilization = float_arg(k, v); }},
    {"num_scheduler_steps", "num_scheduler_steps",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.num_scheduler_steps = int_arg(k, v); }},
    {"enable_prefix_caching", "enable_prefix_caching",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.enable_prefix_caching = bool_arg(k, v); }},
    {"mamba_cache_mode", "mamba_cache_mode",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.mamba_cache_mode = str_arg(k, v); }},
    {"mamba_block_size", "mamba_block_size",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.mamba_block_size = int_arg(k, v); }},
    {"reasoning_parser", "reasoning_parser",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.reasoning_parser = str_arg(k, v); }},
    {"speculative_config", "speculative_config",  // JSON text (the Python side dumps the dict)
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.speculative_config = str_arg(k, v); }},
    {"swap_space", "swap_space",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.swap_space = float_arg(k, v); }},
    {"dtype", "dtype", [](EngineConfig& c, const std::string& k, const py::handle& v) { c.dtype = str_arg(k, v); }},
    {"enforce_eager", "enforce_eager",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.enforce_eager = bool_arg(k, v); }},
    {"quantization", "quantization",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.quantization = str_arg(k, v); }},
    {"generation_config", "generation_config",
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.generation_config = str_arg(k, v); }},
    {"override_generation_config", "override_generation_config",  // JSON text (the Python side dumps the dict)
     [](EngineConfig& c, const std::string& k, const py::handle& v) { c.override_generation_config = str_arg(k, v); }},
    {"load_format", "load_format",
     [](EngineConfig& c, const std::string& k, const py::handle& v) {
       const std::string f = str_arg(k, v);
       if (f == "auto" || f == "safetensors") c.load_format = LoadFormat::Auto;
       else if (f == "dummy") c.load_format = LoadFormat::Dummy;
       else fail("--load-format must be auto, safetensors or dummy (got \"{}\")", f);
     }},
};

}  // namespace

std::string python_message(std::string_view msg, const GivenKeywords& given) {
  return respell_engine_options(msg, [&](const EngineOptionName& o) {
    const auto it = given.find(o.name);
    std::string k(it != given.end() ? std::string_view(it->second) : o.name);
    return o.negated ? k + "=False" : k;
  });
}

EngineConfig make_config(const std::string& model, const py::kwargs& kw, GivenKeywords& given) {
  EngineConfig c;
  c.model = model;
  std::set<std::string> valued;  // options given a value (not None)
  for (auto item : kw) {
    const std::string k = item.first.cast<std::string>();
    const py::handle v = item.second;
    const EngineArg* arg = nullptr;
    for (const EngineArg& a : kEngineArgs)
      if (a.keyword == k) arg = &a;
    if (arg == nullptr) throw py::type_error("LLM() got an unexpected engine argument '" + k + "'");
    const std::string option(arg->option);
    if (v.is_none()) {  // the engine's default, as for vLLM's Optional arguments
      given.try_emplace(option, k);
      continue;
    }
    if (!valued.insert(option).second)  // aliases: threads / num_threads
      throw py::type_error("LLM() got both '" + given[option] + "' and '" + k + "', which set the same engine option");
    given[option] = k;
    try {
      arg->set(c, k, v);
    } catch (const Error& e) {
      throw Error(python_message(e.what(), given));
    }
  }
  return c;
}

void check_engine_args() {
  for (const EngineArg& a : kEngineArgs) {
    bool known = false;
    for (const EngineOptionName& o : kEngineOptionNames) known = known || o.name == a.option;
    if (!known) throw std::logic_error("engine argument " + std::string(a.keyword) + " has no entry in kEngineOptionNames");
  }
}

}  // namespace ssmserve::python
