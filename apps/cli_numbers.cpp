// Owns how the `ssmserve` binary reads numbers on its command line: as vLLM's argparse does (Python's int() and
// float()), not as CLI11's strtoll(base 0), which reads "010" as octal 8 and "0x10" as hex 16, reads an empty value
// as 0 and wraps "-1" to 2^64 - 1 for an unsigned option.
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "apps/commands.h"

namespace ssmserve::cli {
namespace {

/// Python's int() on a command-line word: optional surrounding spaces, an optional sign (not '-' when `is_unsigned`),
/// decimal digits with leading zeros meaning nothing. Rewrites `s` to the canonical digits CLI11 then converts
/// (leading zeros removed, so strtoll cannot read them as octal); returns an error message ("" when fine).
std::string to_decimal_integer(std::string& s, bool is_unsigned) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string sign;
  if (b < e && (s[b] == '+' || s[b] == '-')) {
    if (s[b] == '-') sign = "-";
    ++b;
  }
  if (b == e) return "expected a decimal integer, got \"" + s + "\"";
  for (std::size_t i = b; i < e; ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return "expected a decimal integer, got \"" + s + "\"";
  while (b + 1 < e && s[b] == '0') ++b;
  if (is_unsigned && sign == "-" && !(e - b == 1 && s[b] == '0')) return "expected a non-negative integer, got \"" + s + "\"";
  s = (s[b] == '0' ? std::string() : sign) + s.substr(b, e - b);
  // Beyond 64 bits (CLI11 saturates 64-bit options instead of refusing): an error, as for narrower options.
  const std::string digits = s.substr(sign.empty() || s[0] != '-' ? 0 : 1);
  const std::string limit = is_unsigned ? "18446744073709551615" : sign == "-" ? "9223372036854775808" : "9223372036854775807";
  if (digits.size() > limit.size() || (digits.size() == limit.size() && digits > limit))
    return "\"" + s + "\" is out of range (a " + std::string(is_unsigned ? "64-bit unsigned" : "64-bit") + " integer)";
  return "";
}

/// Python's float() on a command-line word, as far as it matters here: not empty, no hexadecimal ("0x1p-1").
std::string check_decimal_float(const std::string& s) {
  std::size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  if (b == s.size()) return "expected a number, got \"" + s + "\"";
  if (s.find_first_of("xX") != std::string::npos) return "expected a decimal number, got \"" + s + "\"";
  return "";
}

}  // namespace

std::string expand_human_readable_int(std::string& value) {
  if (value.size() < 2) return "";
  const char suffix = value.back();
  const std::string number = value.substr(0, value.size() - 1);
  static const std::string kDecimal = "kmgt", kBinary = "KMGT";
  const size_t dec = kDecimal.find(suffix), bin = kBinary.find(suffix);
  if (dec == std::string::npos && bin == std::string::npos) return "";
  // The number: digits, with one decimal point only for decimal suffixes (vLLM: "1.5K" is an error).
  int dots = 0;
  for (char c : number) {
    if (c == '.') ++dots;
    else if (!std::isdigit(static_cast<unsigned char>(c))) return "";
  }
  if (number.empty() || dots > 1 || number.front() == '.' || number.back() == '.') return "";
  if (dots == 1 && bin != std::string::npos)
    return "\"" + value + "\": decimals are not allowed with binary suffixes like " + std::string(1, suffix) +
           " (did you mean " + number + static_cast<char>(std::tolower(static_cast<unsigned char>(suffix))) + "?)";
  // As vLLM: int(float(number) * 1000^n) for decimal suffixes (truncated), int(number) * 1024^n for binary ones.
  const double scale = dec != std::string::npos ? std::pow(1000.0, static_cast<int>(dec) + 1)
                                                : std::pow(1024.0, static_cast<int>(bin) + 1);
  const double x = std::trunc(std::strtod(number.c_str(), nullptr) * scale);
  if (!(x <= 9.0e18)) return "\"" + value + "\" is too large";
  value = std::to_string(static_cast<long long>(x));
  return "";
}

void read_numbers_as_decimal(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    // CLI11 appends its validators' descriptions ("UINT:UINT in [0 - 1099511627776]"): the type is what precedes them.
    const std::string full = opt->get_type_name(), type = full.substr(0, full.find(':'));
    if (type == "INT" || type == "UINT") {
      const bool is_unsigned = type == "UINT";
      // vLLM's human-readable token counts ("32k", "1M"), and --max-model-len's "auto" (= -1: the default).
      const std::string name = opt->get_name();
      const bool tokens = name == "--max-model-len" || name == "--max-num-batched-tokens";
      const bool model_len = name == "--max-model-len";
      opt->transform(CLI::Validator([is_unsigned, tokens, model_len](std::string& s) {
        if (model_len && s == "auto") s = "-1";
        if (tokens)
          if (std::string e = expand_human_readable_int(s); !e.empty()) return e;
        return to_decimal_integer(s, is_unsigned);
      }, ""));
    } else if (type == "FLOAT") {
      opt->check(CLI::Validator([](std::string& s) { return check_decimal_float(s); }, ""));
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) read_numbers_as_decimal(*sub);
}

}  // namespace ssmserve::cli
