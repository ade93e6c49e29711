// Owns the respelling log sink (see log_sink.h).
#include "log_sink.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "engine_args.h"

namespace ssmserve::python {
namespace {

/// Formats each line after respelling its message (python_message), then writes it to stderr.
class RespellingSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string text = python_message(std::string_view(msg.payload.data(), msg.payload.size()));
    spdlog::details::log_msg respelt = msg;
    respelt.payload = text;
    spdlog::memory_buf_t line;
    formatter_->format(respelt, line);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

}  // namespace

void install_respelling_logger() {
  const spdlog::level::level_enum level = spdlog::default_logger()->level();
  auto logger = std::make_shared<spdlog::logger>("", std::make_shared<RespellingSink>());
  logger->set_level(level);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace ssmserve::python
