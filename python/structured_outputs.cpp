// Owns the StructuredOutputsParams class's binding (declared in structured_outputs.h): vLLM's constructor
// (vllm/sampling_params.py: json str | dict, regex, choice list[str], grammar, json_object, disable_any_whitespace,
// disable_additional_properties, whitespace_pattern, structural_tag), its fields listed once (SSM_STRUCTURED_FIELDS)
// for the pickle state.
#include "structured_outputs.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "engine/structured_output.h"

namespace py = pybind11;

namespace ssmserve::python {
namespace {

/// "value (type)" for an error message: the value's repr (cut at 200 characters) and its type's name.
std::string describe(const py::handle& v) {
  std::string r = py::repr(v).cast<std::string>();
  if (r.size() > 200) r = r.substr(0, 200) + "...";
  return r + " (" + py::type::handle_of(v).attr("__name__").cast<std::string>() + ")";
}

[[noreturn]] void type_error(const std::string& field, const char* want, const py::handle& v) {
  throw py::type_error("structured_outputs." + field + " must be " + want + ", got " + describe(v));
}

/// A str's UTF-8 text; ValueError naming `field` for one that cannot be encoded (lone surrogates).
std::string utf8(const py::handle& s, const std::string& field) {
  Py_ssize_t n = 0;
  const char* data = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
  if (data == nullptr) {
    PyErr_Clear();
    throw py::value_error("structured_outputs." + field + " is not encodable as UTF-8 text");
  }
  return std::string(data, static_cast<size_t>(n));
}

/// None -> unset; a str -> its text; anything else a TypeError naming `field`.
std::optional<std::string> optional_str(const py::handle& v, const char* field) {
  if (v.is_none()) return std::nullopt;
  if (!py::isinstance<py::str>(v)) type_error(field, "None or a str", v);
  return utf8(v, field);
}

/// vLLM's `json`: None, the schema's JSON text (str), or the schema as a dict (written as JSON text by Python's
/// json.dumps, keys in their order: xgrammar emits properties in schema order). TypeError for other types or a dict
/// json.dumps cannot write; ValueError for NaN / infinite numbers or a circular reference.
std::optional<std::string> json_schema_text(const py::handle& v) {
  if (v.is_none() || py::isinstance<py::str>(v)) return optional_str(v, "json");
  if (!py::isinstance<py::dict>(v)) type_error("json", "None, a JSON schema dict or its JSON text (str)", v);
  try {
    return utf8(py::module_::import("json").attr("dumps")(v, py::arg("allow_nan") = false), "json");
  } catch (py::error_already_set& e) {
    const std::string why =
        "structured_outputs.json: the schema dict cannot be written as JSON: " + std::string(py::str(e.value()));
    if (e.matches(PyExc_TypeError)) throw py::type_error(why);
    if (e.matches(PyExc_ValueError)) throw py::value_error(why);
    throw;
  }
}

/// vLLM's `choice`: None or a list (or tuple) of str.
std::optional<std::vector<std::string>> choice_list(const py::handle& v) {
  if (v.is_none()) return std::nullopt;
  if (!py::isinstance<py::list>(v) && !py::isinstance<py::tuple>(v)) type_error("choice", "None or a list of str", v);
  std::vector<std::string> out;
  for (const py::handle item : v) {
    const std::string field = "choice[" + std::to_string(out.size()) + "]";
    if (!py::isinstance<py::str>(item)) type_error(field, "a str", item);
    out.push_back(utf8(item, field));
  }
  return out;
}

/// vLLM's `json_object`: None (unset) or True; False is a ValueError, as vLLM refuses it ("must be True if set").
bool json_object_flag(const py::handle& v) {
  if (v.is_none()) return false;
  if (!PyBool_Check(v.ptr())) type_error("json_object", "None or True", v);
  if (v.ptr() == Py_False)
    throw py::value_error(
        "structured_outputs.json_object must be True if set (None, the default, leaves it unset; "
        "omit structured_outputs for unconstrained output)");
  return true;
}

bool strict_bool(const py::handle& v, const char* field) {
  if (!PyBool_Check(v.ptr())) type_error(field, "a bool", v);
  return v.ptr() == Py_True;
}

/// vLLM's `whitespace_pattern` (a regex for the whitespace of JSON output): only None; xgrammar has no such option
/// (disable_any_whitespace=True leaves whitespace out).
void check_whitespace_pattern(const py::handle& v) {
  if (!v.is_none())
    throw py::value_error(
        "structured_outputs.whitespace_pattern is not supported (ssmserve's xgrammar backend has no "
        "whitespace pattern; disable_any_whitespace=True leaves whitespace out of JSON output)");
}

py::object json_object_value(const StructuredOutputsParams& p) {
  return p.json_object ? py::object(py::bool_(true)) : py::none();
}

}  // namespace

void bind_structured_outputs(py::module_& m) {
  using SO = StructuredOutputsParams;
  m.attr("has_structured_outputs") = StructuredOutputManager::available();

  // Every field of the C++ struct, once, for the pickle state and its check.
#define SSM_STRUCTURED_FIELDS(X)                                          \
  X(json) X(regex) X(choice) X(grammar) X(json_object) X(structural_tag) \
  X(disable_any_whitespace) X(disable_additional_properties)
  auto state = [](const SO& p) {
    py::dict d;
#define SSM_GET(f) d[#f] = py::cast(p.f);
    SSM_STRUCTURED_FIELDS(SSM_GET)
#undef SSM_GET
    return d;
  };

  py::class_<SO> so(
      m, "StructuredOutputsParams",
      "vLLM's StructuredOutputsParams: exactly one constraint of json (a JSON schema: dict or JSON text), "
      "regex, choice (list of str), grammar (EBNF), json_object (True) or structural_tag (JSON text).");
  so.def(py::init([](const py::object& json, const py::object& regex, const py::object& choice,
                     const py::object& grammar, const py::object& json_object, const py::object& disable_any_whitespace,
                     const py::object& disable_additional_properties, const py::object& whitespace_pattern,
                     const py::object& structural_tag, const py::kwargs& unknown) {
           for (const auto item : unknown)
             throw py::type_error("StructuredOutputsParams() got an unexpected keyword argument '" +
                                  py::str(item.first).cast<std::string>() + "'");
           SO p;
           p.json = json_schema_text(json);
           p.regex = optional_str(regex, "regex");
           p.choice = choice_list(choice);
           p.grammar = optional_str(grammar, "grammar");
           p.json_object = json_object_flag(json_object);
           p.disable_any_whitespace = strict_bool(disable_any_whitespace, "disable_any_whitespace");
           p.disable_additional_properties =
               strict_bool(disable_additional_properties, "disable_additional_properties");
           check_whitespace_pattern(whitespace_pattern);
           p.structural_tag = optional_str(structural_tag, "structural_tag");
           p.validate();  // exactly one kind, non-empty (as vLLM's __post_init__): ssmserve::Error, a ValueError
           return p;
         }),
         py::arg("json") = py::none(), py::arg("regex") = py::none(), py::arg("choice") = py::none(),
         py::arg("grammar") = py::none(), py::arg("json_object") = py::none(),
         py::arg("disable_any_whitespace") = false, py::arg("disable_additional_properties") = false,
         py::arg("whitespace_pattern") = py::none(), py::arg("structural_tag") = py::none());

  // Attributes: each value as the constructor takes it (json: set from a dict or a str, read back as JSON text).
  so.def_property(
        "json", [](const SO& p) { return p.json; }, [](SO& p, const py::object& v) { p.json = json_schema_text(v); })
      .def_property(
          "regex", [](const SO& p) { return p.regex; },
          [](SO& p, const py::object& v) { p.regex = optional_str(v, "regex"); })
      .def_property(
          "choice", [](const SO& p) { return p.choice; }, [](SO& p, const py::object& v) { p.choice = choice_list(v); })
      .def_property(
          "grammar", [](const SO& p) { return p.grammar; },
          [](SO& p, const py::object& v) { p.grammar = optional_str(v, "grammar"); })
      .def_property("json_object", &json_object_value,
                    [](SO& p, const py::object& v) { p.json_object = json_object_flag(v); })
      .def_property(
          "disable_any_whitespace", [](const SO& p) { return p.disable_any_whitespace; },
          [](SO& p, const py::object& v) { p.disable_any_whitespace = strict_bool(v, "disable_any_whitespace"); })
      .def_property(
          "disable_additional_properties", [](const SO& p) { return p.disable_additional_properties; },
          [](SO& p, const py::object& v) {
            p.disable_additional_properties = strict_bool(v, "disable_additional_properties");
          })
      .def_property(
          "whitespace_pattern", [](const SO&) { return py::none(); },
          [](SO&, const py::object& v) { check_whitespace_pattern(v); },
          "Always None (not supported: see the constructor)")
      .def_property(
          "structural_tag", [](const SO& p) { return p.structural_tag; },
          [](SO& p, const py::object& v) { p.structural_tag = optional_str(v, "structural_tag"); });

  so.def("validate", &SO::validate,
         "ValueError (SsmserveError) naming the field unless exactly one constraint is set and it is not empty")
      .def(
          "all_constraints_none", [](const SO& p) { return p.num_constraints() == 0; },
          "True when no constraint (json, regex, choice, grammar, json_object, structural_tag) is set (vLLM's)")
      .def(
          "all_non_structural_tag_constraints_none",
          [](const SO& p) { return p.num_constraints() - int{p.structural_tag.has_value()} == 0; },
          "True when no constraint but possibly structural_tag is set (vLLM's)")
      .def("__eq__",
           [](const SO& a, const py::object& b) -> py::object {
             if (!py::isinstance<SO>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::bool_(a == b.cast<const SO&>());
           })
      .attr("__hash__") = py::none();  // mutable, as vLLM's dataclass
  // pickle / copy.deepcopy: a dict of every field (not validated again: a SamplingParams holding it is, when added).
  so.def(py::pickle(state, [](const py::dict& d) {
    SO p;
    size_t known = 0;
#define SSM_SET(f)                                                                       \
  if (d.contains(#f)) {                                                                  \
    p.f = d[#f].cast<decltype(p.f)>();                                                   \
    ++known;                                                                             \
  } else {                                                                               \
    throw py::value_error("StructuredOutputsParams: pickle state lacks field '" #f "'"); \
  }
    SSM_STRUCTURED_FIELDS(SSM_SET)
#undef SSM_SET
#undef SSM_STRUCTURED_FIELDS
    if (known != d.size()) throw py::value_error("StructuredOutputsParams: pickle state has unknown fields");
    return p;
  }));
  so.def("__repr__", [](const SO& p) {  // vLLM's dataclass repr (its fields in its order)
    return py::str(
               "StructuredOutputsParams(json={!r}, regex={!r}, choice={!r}, grammar={!r}, json_object={!r}, "
               "disable_any_whitespace={!r}, disable_additional_properties={!r}, whitespace_pattern=None, "
               "structural_tag={!r})")
        .format(p.json, p.regex, p.choice, p.grammar, json_object_value(p), p.disable_any_whitespace,
                p.disable_additional_properties, p.structural_tag)
        .cast<std::string>();
  });
}

}  // namespace ssmserve::python
