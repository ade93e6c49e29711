// save_dummy_checkpoint CONFIG_DIR OUT_FILE: writes the dummy weights ssmserve generates for CONFIG_DIR/config.json
// (--load-format dummy) as a safetensors file (model/dummy_checkpoint.h), for transformers to make goldens from.
#include <cstdio>
#include <exception>

#include "model/dummy_checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CONFIG_DIR OUT_FILE\n", argv[0]);
    return 2;
  }
  try {
    ssmserve::save_dummy_checkpoint(ssmserve::ModelConfig::load(argv[1]), argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
