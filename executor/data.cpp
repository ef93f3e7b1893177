#include "executor/data.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <tuple>
#include <iterator>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

Status missing(const std::string& path, const std::string& package) {
  return Status(ErrorCode::not_found, "dataset file " + path + " is missing (install Debian's " + package + ")");
}

Result<std::string> gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return Status(ErrorCode::io_error, "cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  const bool bad = n < 0;
  gzclose(f);
  if (bad) return Status(ErrorCode::io_error, path + " is not a valid gzip file");
  return out;
}

Result<Split> load_digits(const std::string& path, uint64_t seed) {
  if (!std::filesystem::exists(path)) return missing(path, "python3-sklearn");
  TIERMEM_ASSIGN_OR_RETURN(auto text, gunzip(path));
  Dataset all;
  all.cols = 64;
  all.classes = 10;
  // Parsed in place (a stream per line and per cell took most of a
  // replacement rank's start: its RTO).
  int64_t line_number = 0;
  std::vector<float> values;
  for (size_t at = 0; at < text.size();) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) eol = text.size();
    const std::string_view line(text.data() + at, eol - at);
    at = eol + 1;
    ++line_number;
    if (line.empty()) continue;
    values.clear();
    for (size_t c = 0; c <= line.size();) {
      size_t comma = line.find(',', c);
      if (comma == std::string_view::npos) comma = line.size();
      const std::string_view cell = line.substr(c, comma - c);
      c = comma + 1;
      float v = 0;
      const auto [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
      if (ec != std::errc() || end != cell.data() + cell.size()) {
        return Status(ErrorCode::invalid_argument, path + ":" + std::to_string(line_number) + ": '" +
                                                       std::string(cell) + "' is not a number");
      }
      values.push_back(v);
    }
    if (values.size() != 65) return Status(ErrorCode::invalid_argument, path + ": a row has " + std::to_string(values.size()) + " values, not 65");
    for (int i = 0; i < 64; ++i) all.features.push_back(values[i] / 16.0f);
    all.labels.push_back(static_cast<int32_t>(values[64]));
    ++all.rows;
  }
  // A fixed shuffle, then 80 % train, 20 % test.
  std::vector<int64_t> order(static_cast<size_t>(all.rows));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  Split split;
  split.name = "digits";
  const int64_t train_rows = all.rows * 4 / 5;
  for (Dataset* d : {&split.train, &split.test}) {
    d->cols = 64;
    d->classes = 10;
  }
  for (int64_t i = 0; i < all.rows; ++i) {
    Dataset& d = i < train_rows ? split.train : split.test;
    const int64_t r = order[static_cast<size_t>(i)];
    d.features.insert(d.features.end(), all.features.begin() + r * 64, all.features.begin() + (r + 1) * 64);
    d.labels.push_back(all.labels[static_cast<size_t>(r)]);
    ++d.rows;
  }
  return split;
}

uint32_t be32(const std::string& s, size_t at) {
  return static_cast<uint32_t>(static_cast<unsigned char>(s[at])) << 24 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[at + 1])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[at + 2])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[at + 3]));
}

Status load_idx(const std::string& dir, const std::string& prefix, Dataset* d) {
  const std::string images = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  for (const auto& p : {images, labels}) {
    if (!std::filesystem::exists(p)) return missing(p, "dataset-fashion-mnist");
  }
  TIERMEM_ASSIGN_OR_RETURN(auto img, gunzip(images));
  TIERMEM_ASSIGN_OR_RETURN(auto lab, gunzip(labels));
  if (img.size() < 16 || be32(img, 0) != 0x803 || lab.size() < 8 || be32(lab, 0) != 0x801) {
    return Status(ErrorCode::invalid_argument, "IDX headers of " + images + " / " + labels + " are not valid");
  }
  const uint32_t n = be32(img, 4), h = be32(img, 8), w = be32(img, 12);
  if (be32(lab, 4) != n || img.size() < 16 + size_t{n} * h * w || lab.size() < 8 + size_t{n}) {
    return Status(ErrorCode::invalid_argument, images + " and " + labels + " disagree or are truncated");
  }
  d->rows = n;
  d->cols = static_cast<int64_t>(h) * w;
  d->classes = 10;
  d->features.resize(static_cast<size_t>(d->rows * d->cols));
  for (size_t i = 0; i < d->features.size(); ++i) {
    d->features[i] = static_cast<float>(static_cast<unsigned char>(img[16 + i])) / 255.0f;
  }
  d->labels.resize(n);
  for (uint32_t i = 0; i < n; ++i) d->labels[i] = static_cast<unsigned char>(lab[8 + i]);
  return Status();
}

// "synthetic:COLS:CLASSES": uniform features, each row labelled by the
// arg-max of a fixed random projection (learnable, and as wide as a
// benchmark needs); from `seed`.
Result<Split> synthetic(const std::string& name, uint64_t seed) {
  int64_t cols = 0, classes = 0;
  char tail = 0;
  if (std::sscanf(name.c_str(), "synthetic:%" SCNd64 ":%" SCNd64 "%c", &cols, &classes, &tail) != 2 || cols < 1 ||
      cols > (1 << 16) || classes < 2 || classes > 1024) {
    return Status(ErrorCode::invalid_argument,
                  "dataset '" + name + "': synthetic:COLS:CLASSES with COLS in 1..65536 and CLASSES in 2..1024");
  }
  std::mt19937_64 rng(seed ^ 0x5eedda7aull);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> projection(static_cast<size_t>(cols * classes));
  for (float& w : projection) w = u(rng) - 0.5f;
  Split split;
  split.name = name;
  for (auto [d, rows] : {std::pair{&split.train, int64_t{16384}}, std::pair{&split.test, int64_t{2048}}}) {
    d->rows = rows;
    d->cols = cols;
    d->classes = static_cast<int>(classes);
    d->features.resize(static_cast<size_t>(rows * cols));
    d->labels.resize(static_cast<size_t>(rows));
    std::vector<float> score(static_cast<size_t>(classes));
    for (int64_t r = 0; r < rows; ++r) {
      float* x = d->features.data() + r * cols;
      std::fill(score.begin(), score.end(), 0.0f);
      for (int64_t j = 0; j < cols; ++j) {
        x[j] = u(rng);
        for (int64_t c = 0; c < classes; ++c) score[static_cast<size_t>(c)] += (x[j] - 0.5f) * projection[static_cast<size_t>(j * classes + c)];
      }
      d->labels[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(score.begin(), score.end()) - score.begin());
    }
  }
  return split;
}

// "text:WHERE": bytes as tokens (see data.hpp).
Result<Split> load_text(const std::string& where, int64_t sequence) {
  if (sequence < 1) return Status(ErrorCode::invalid_argument, "a text dataset needs sequences of at least one token");
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  if (std::filesystem::is_directory(where, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(where, ec)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else if (std::filesystem::is_regular_file(where, ec)) {
    files.push_back(where);
  }
  if (files.empty()) {
    return where == k_fortunes_dir ? missing(where, "fortunes")
                                   : Status(ErrorCode::not_found, "text dataset " + where + ": no such file or directory of files");
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return Status(ErrorCode::io_error, "text dataset: cannot read " + f.string());
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const int64_t windows = (static_cast<int64_t>(text.size()) - 1) / sequence;
  if (windows < 10) {
    return Status(ErrorCode::invalid_argument, "text dataset " + where + " has " + std::to_string(text.size()) +
                                                   " bytes: fewer than 10 windows of " + std::to_string(sequence));
  }
  Split split;
  split.name = "text:" + where;
  const int64_t train_rows = windows - windows / 10;
  for (auto [d, first, rows] : {std::tuple{&split.train, int64_t{0}, train_rows},
                                std::tuple{&split.test, train_rows, windows - train_rows}}) {
    d->rows = rows;
    d->cols = d->label_cols = sequence;
    d->classes = 256;
    d->ids.resize(static_cast<size_t>(rows * sequence));
    d->labels.resize(d->ids.size());
    const auto* bytes = reinterpret_cast<const unsigned char*>(text.data()) + first * sequence;
    for (size_t i = 0; i < d->ids.size(); ++i) {
      d->ids[i] = bytes[i];
      d->labels[i] = bytes[i + 1];
    }
  }
  return split;
}

}  // namespace

Result<Split> load_dataset(const std::string& name, const std::string& path, uint64_t seed, int64_t sequence) {
  if (name == "text:fortunes") return load_text(path.empty() ? k_fortunes_dir : path, sequence);
  if (name.rfind("text:", 0) == 0) return load_text(path.empty() ? name.substr(5) : path, sequence);
  if (name == "digits") return load_digits(path.empty() ? k_digits_path : path, seed);
  if (name == "fashion-mnist") {
    Split split;
    split.name = name;
    const std::string dir = path.empty() ? k_fashion_dir : path;
    TIERMEM_RETURN_IF_ERROR(load_idx(dir, "train", &split.train));
    TIERMEM_RETURN_IF_ERROR(load_idx(dir, "t10k", &split.test));
    return split;
  }
  if (name.rfind("synthetic:", 0) == 0) return synthetic(name, seed);
  return Status(ErrorCode::invalid_argument,
                "unknown dataset '" + name + "' (digits, fashion-mnist, synthetic:COLS:CLASSES, text:PATH or text:fortunes)");
}

void fill_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t start, int64_t rows, void* x,
                int32_t* y) {
  const auto n = static_cast<int64_t>(order.size());
  const bool tokens = !data.ids.empty();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = order[static_cast<size_t>((start + i) % n)];
    if (x != nullptr) {
      const void* from = tokens ? static_cast<const void*>(data.ids.data() + r * data.cols)
                                : static_cast<const void*>(data.features.data() + r * data.cols);
      std::memcpy(static_cast<char*>(x) + i * data.cols * 4, from, static_cast<size_t>(data.cols) * 4);
    }
    if (y != nullptr) {
      std::memcpy(y + i * data.label_cols, data.labels.data() + r * data.label_cols,
                  static_cast<size_t>(data.label_cols) * 4);
    }
  }
}

}  // namespace tiermem::exec
