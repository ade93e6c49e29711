// The `ssmserve` binary: parses the command line and dispatches to the generate / bench subcommands.
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"ssmserve: inference and serving for recurrent-state language models"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
