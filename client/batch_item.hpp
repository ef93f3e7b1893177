// One operation of a client Batch (include/tiermem/batch.h) as the library
// runs it (client/batch.cpp, Client::run_batch, ClientCore::start_batch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

namespace tiermem::detail {

struct BatchItem {
  enum class Kind : uint8_t { read, write, fetch_add, compare_swap };
  Kind kind = Kind::read;
  Gva gva;
  std::byte* buffer = nullptr;  // host memory (reads and writes)
  size_t length = 0;
  uint64_t a = 0, b = 0;        // fetch_add: a; compare_swap: expected a, desired b
  std::optional<QosClass> qos;
  size_t epoch = 0;             // fences posted before it
  bool in_flight = false;       // posted by ClientCore::start_batch
  bool handled = false;         // status and value are final
  Status status;
  uint64_t value = 0;           // an atomic's word before
};

}  // namespace tiermem::detail
