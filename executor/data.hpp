// Datasets for training: the UCI handwritten digits (Debian's python3-sklearn
// ships them) and Fashion-MNIST (Debian's dataset-fashion-mnist, IDX files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/status.h>

namespace tiermem::exec {

struct Dataset {
  std::vector<float> features;  // rows x cols, scaled to [0, 1]
  std::vector<int32_t> labels;
  int64_t rows = 0;
  int64_t cols = 0;
  int classes = 0;
};

struct Split {
  std::string name;
  Dataset train, test;
};

inline constexpr const char* k_digits_path = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
inline constexpr const char* k_fashion_dir = "/usr/share/datasets/fashion-mnist";

// "digits" (1797 samples, split 80/20 with `seed`), "fashion-mnist" (its
// own 60000/10000 split) or "synthetic:COLS:CLASSES" (16384/2048 rows of
// random features labelled by a random linear map, for benchmarks). `path` overrides the default location. Errors:
// not_found (with the package to install), io_error, invalid_argument.
Result<Split> load_dataset(const std::string& name, const std::string& path, uint64_t seed);

// Copies rows order[start .. start+rows) (wrapping) into x and y.
void fill_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t start, int64_t rows, float* x,
                int32_t* y);

}  // namespace tiermem::exec
