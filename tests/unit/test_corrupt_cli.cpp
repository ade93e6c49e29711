// Owns the end-to-end corrupt-checkpoint tests: the real `ssmserve generate` binary, pointed at a copy of
// models/tiny-mamba with one defect, must exit with status 1 (never a signal) and name the problem on stderr.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "checkpoint_fixtures.h"

namespace ssmserve {
namespace {

namespace fs = std::filesystem;
using ::ssmserve::testing::read_file;
using ::ssmserve::testing::SafetensorsImage;
using ::ssmserve::testing::TempDir;
using ::ssmserve::testing::write_file;
using ::testing::HasSubstr;
using ::testing::Not;

const fs::path kTinyMamba = fs::path(SSMSERVE_SOURCE_DIR) / "models/tiny-mamba";

/// How a child process ended and what it wrote to stderr.
struct RunResult {
  bool exited = false;  ///< true when it called exit (false: killed by a signal)
  int code = -1;        ///< exit status, or the signal number when !exited
  std::string err;
};

/// Runs `argv` (argv[0] = executable path) with stdout discarded and stderr captured; killed by SIGALRM after
/// `timeout_s` seconds.
RunResult run_process(const std::vector<std::string>& argv, const fs::path& err_path, unsigned timeout_s = 300) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (err_fd < 0 || null_fd < 0) throw std::runtime_error("cannot open capture files");
  const pid_t pid = ::fork();
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::alarm(timeout_s);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(err_fd);
  ::close(null_fd);
  if (pid < 0) throw std::runtime_error("fork failed");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid failed");
  }
  RunResult r;
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : WTERMSIG(status);
  r.err = read_file(err_path);
  return r;
}

class CorruptCli : public ::testing::Test {
 protected:
  /// The real checkpoint, parsed once for every test.
  static const SafetensorsImage& original() {
    static const SafetensorsImage img = SafetensorsImage::load(kTinyMamba / "model.safetensors");
    return img;
  }

  /// A copy of tiny-mamba's config and tokenizer files in a temp dir, with `model` as model.safetensors.
  void make_model(const std::string& model_bytes) {
    for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(kTinyMamba / f, dir_ / f, fs::copy_options::overwrite_existing);
    write_file(dir_ / "model.safetensors", model_bytes);
  }

  /// make_model with the original data and a header edited by `edit`.
  void make_model_with_header(const std::function<void(nlohmann::json&)>& edit) {
    SafetensorsImage img = original();
    edit(img.header);
    make_model(img.serialize());
  }

  /// Runs `ssmserve generate` on the temp model folder.
  RunResult generate() {
    const std::string bin = SSMSERVE_BINARY;
    if (!fs::exists(bin)) ADD_FAILURE() << "binary not built: " << bin;
    return run_process({bin, "generate", "--model", dir_.path().string(), "--prompt", "hi", "--max-tokens", "1"},
                       scratch_ / "stderr.txt");
  }

  /// Asserts a clean failure: exit status exactly 1, no sanitizer report, stderr containing every `needles`.
  void expect_clean_failure(const std::vector<std::string>& needles) {
    const RunResult r = generate();
    EXPECT_TRUE(r.exited) << "killed by signal " << r.code << "; stderr:\n" << r.err;
    EXPECT_EQ(r.code, 1) << "stderr:\n" << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("Sanitizer")));
    EXPECT_THAT(r.err, Not(HasSubstr("runtime error:")));
    for (const auto& n : needles) EXPECT_THAT(r.err, HasSubstr(n));
  }

  TempDir dir_{"corrupt-model"};
  TempDir scratch_{"corrupt-out"};
};

TEST_F(CorruptCli, IntactCopyGenerates) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  const RunResult r = generate();
  EXPECT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CorruptCli, TruncatedFile) {
  const std::string full = original().serialize();
  make_model(full.substr(0, full.size() / 2));
  expect_clean_failure({"model.safetensors", "truncated"});
}

TEST_F(CorruptCli, TruncatedInsideHeader) {
  make_model(original().serialize().substr(0, 1000));
  expect_clean_failure({"model.safetensors", "header length"});
}

TEST_F(CorruptCli, BadHeaderLength) {
  make_model(original().serialize(uint64_t{1} << 40));
  expect_clean_failure({"model.safetensors", "header length"});
}

TEST_F(CorruptCli, NonJsonHeader) {
  const std::string h(64, '#');
  make_model(original().with_header_text(h, h.size()));
  expect_clean_failure({"model.safetensors", "not valid JSON"});
}

TEST_F(CorruptCli, OffsetsOutOfRange) {
  const uint64_t size = original().data.size();
  make_model_with_header([&](nlohmann::json& h) {
    h["backbone.norm_f.weight"]["data_offsets"] = {size - 256, size + 256};
  });
  expect_clean_failure({"model.safetensors", "backbone.norm_f.weight", "data_offsets"});
}

TEST_F(CorruptCli, OffsetsDisagreeWithShape) {
  make_model_with_header([](nlohmann::json& h) { h["backbone.layers.2.mixer.A_log"]["shape"] = {512, 17}; });
  expect_clean_failure({"model.safetensors", "backbone.layers.2.mixer.A_log"});
}

TEST_F(CorruptCli, WrongDtype) {
  // Same element size, so the header is consistent; the model must refuse the dtype when it reads the tensor.
  make_model_with_header([](nlohmann::json& h) { h["backbone.layers.0.mixer.D"]["dtype"] = "I16"; });
  expect_clean_failure({"model.safetensors", "backbone.layers.0.mixer.D", "I16"});
}

TEST_F(CorruptCli, WrongShape) {
  // Same element count as [1024, 256], so only the config-derived shape check can catch it.
  make_model_with_header([](nlohmann::json& h) { h["backbone.layers.3.mixer.in_proj.weight"]["shape"] = {512, 512}; });
  expect_clean_failure({"model.safetensors", "backbone.layers.3.mixer.in_proj.weight", "[512, 512]"});
}

TEST_F(CorruptCli, MissingTensor) {
  make_model_with_header([](nlohmann::json& h) { h.erase("backbone.layers.5.mixer.dt_proj.bias"); });
  expect_clean_failure({"backbone.layers.5.mixer.dt_proj.bias", "missing"});
}

TEST_F(CorruptCli, InvalidJsonConfig) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  write_file(dir_ / "config.json", "{\"hidden_size\": 256,, \"num_hidden_layers\": 8}");
  expect_clean_failure({"config.json", "invalid JSON"});
}

TEST_F(CorruptCli, InvalidConfigField) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  auto cfg = nlohmann::json::parse(read_file(kTinyMamba / "config.json"));
  cfg["state_size"] = "abc";
  write_file(dir_ / "config.json", cfg.dump(2));
  expect_clean_failure({"config.json", "\"state_size\""});
}

}  // namespace
}  // namespace ssmserve
