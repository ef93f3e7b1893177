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
  std::vector<int32_t> ids;     // rows x cols token ids instead (text): features is empty then
  std::vector<int32_t> labels;  // rows x label_cols
  int64_t rows = 0;             // samples
  int64_t cols = 0;
  int64_t label_cols = 1;       // a class per sample, or per token (text: the next byte)
  int classes = 0;              // the vocabulary, for text
};

struct Split {
  std::string name;
  Dataset train, test;
};

inline constexpr const char* k_digits_path = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
inline constexpr const char* k_fashion_dir = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* k_fortunes_dir = "/usr/share/games/fortunes";

// "digits" (1797 samples, split 80/20 with `seed`), "fashion-mnist" (its
// own 60000/10000 split), "synthetic:COLS:CLASSES" (16384/2048 rows of
// random features labelled by a random linear map, for benchmarks), or
// "text:PATH" / "text:fortunes" (the bytes of a file, or of a directory's
// files in name order, *.dat and *.u8 left out: Debian's fortunes package
// for the second; samples are the windows of `sequence` bytes one after the
// other, each labelled by the window one byte on; the last tenth is the
// test split). `path` overrides the default location. Errors: not_found
// (with the package to install), io_error, invalid_argument.
Result<Split> load_dataset(const std::string& name, const std::string& path, uint64_t seed, int64_t sequence = 1);

// Copies rows order[start .. start+rows) (wrapping) into x (floats, or
// token ids) and y.
void fill_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t start, int64_t rows, void* x,
                int32_t* y);

}  // namespace tiermem::exec
