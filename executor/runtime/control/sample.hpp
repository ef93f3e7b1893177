// tiermem-exec sample: text from a model of bytes (a GPT on a text:...
// dataset) trained with --keep. Its committed parameters are read from the
// job's memory in tiermem; the model's forward ops run on the CPU, one byte
// at a time over the last `context` bytes, each drawn from the softmax at
// `temperature` (0: the most likely byte).
#pragma once

#include <cstdint>
#include <string>

namespace tiermem::exec {

struct SampleOptions {
  std::string model;
  std::string job;
  std::string socket;
  std::string prompt;
  int64_t bytes = 300;
  double temperature = 0.8;
  uint64_t seed = 1;
};

// Prints the prompt and the bytes drawn; returns the exit status (1 with a
// message: no such kept job, another model, not a model of text).
int sample(const SampleOptions& options);

}  // namespace tiermem::exec
