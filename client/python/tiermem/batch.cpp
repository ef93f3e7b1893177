// tiermem.Batch: libtiermem's Batch for Python (client.batch()). The buffers
// given to it (writes' data, read_into's targets) and the reads' results are
// held by the batch until it has completed; waiting releases the GIL.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <vector>

#include <tiermem/batch.h>

#include "py_common.hpp"

namespace tiermem::py {
namespace {

using pyb::arg;

class PyBatch {
 public:
  PyBatch(std::shared_ptr<Client> client, std::optional<QosClass> qos)
      : m_client(std::move(client)), m_batch(std::make_unique<Batch>(*m_client, BatchOptions{.qos = qos})) {}
  ~PyBatch() { finish(); }

  size_t write(pyb::handle gva, pyb::handle data) {
    auto buffer = std::make_unique<HostBuffer>(data, false, "write");
    const size_t i = open().write(as_gva(gva), buffer->data(), buffer->size());
    keep(i, std::move(buffer), pyb::none());
    return i;
  }
  size_t read(pyb::handle gva, size_t length) {
    auto out = pyb::reinterpret_steal<pyb::bytearray>(
        PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(length)));
    if (!out) throw pyb::error_already_set();
    const size_t i = open().read(as_gva(gva), PyByteArray_AS_STRING(out.ptr()), length);
    keep(i, nullptr, out);
    return i;
  }
  size_t read_into(pyb::handle gva, pyb::handle target) {
    auto buffer = std::make_unique<HostBuffer>(target, true, "read_into");
    const size_t i = open().read(as_gva(gva), buffer->data(), buffer->size());
    keep(i, std::move(buffer), pyb::reinterpret_borrow<pyb::object>(target));
    return i;
  }
  size_t fetch_add(pyb::handle gva, uint64_t value) { return hold_nothing(open().fetch_add(as_gva(gva), value)); }
  size_t compare_swap(pyb::handle gva, uint64_t expected, uint64_t desired) {
    return hold_nothing(open().compare_swap(as_gva(gva), expected, desired));
  }
  void fence() { open().fence(); }
  void submit() { open().submit(); }

  // Waits for every operation; raises the first error.
  void wait(double timeout_s) {
    Batch& b = open();
    Status s;
    {
      pyb::gil_scoped_release release;
      s = b.wait(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    }
    check(s);
  }
  bool done() const { return m_batch == nullptr || m_batch->test(); }
  size_t size() const { return m_held.size(); }
  // None when operation `i` succeeded, else (code name, message).
  pyb::object status(size_t i) const {
    const Status s = checked(i).status(i);
    if (s.ok()) return pyb::none();
    return pyb::make_tuple(std::string(error_code_name(s.code())), s.message());
  }
  uint64_t value(size_t i) const { return checked(i).value(i); }
  // What a read or read_into gave: a bytearray, or the target object.
  pyb::object result(size_t i) const {
    const Batch& b = checked(i);
    if (!b.status(i).ok()) raise(b.status(i).with_context("operation " + std::to_string(i) + " of the batch"));
    return m_held[i].result;
  }
  // Waits (without raising) and lets the buffers go.
  void finish() {
    if (m_batch == nullptr) return;
    {
      pyb::gil_scoped_release release;
      (void)m_batch->wait(std::chrono::hours(24));
    }
    m_done = std::move(m_batch);
    for (Held& h : m_held) h.buffer.reset();  // with the GIL: releases the Python buffers
  }

 private:
  struct Held {
    std::unique_ptr<HostBuffer> buffer;
    pyb::object result;
  };
  Batch& open() {
    if (m_batch == nullptr) {
      raise(Status(ErrorCode::failed_precondition, "this batch is finished (its with-block ended): start another"));
    }
    return *m_batch;
  }
  const Batch& checked(size_t i) const {
    const Batch* b = m_batch != nullptr ? m_batch.get() : m_done.get();
    if (i >= m_held.size()) {
      raise(Status(ErrorCode::out_of_range, "operation " + std::to_string(i) + " of a batch of " +
                                                 std::to_string(m_held.size())));
    }
    return *b;
  }
  void keep(size_t i, std::unique_ptr<HostBuffer> buffer, pyb::object result) {
    if (m_held.size() <= i) m_held.resize(i + 1);
    m_held[i] = Held{std::move(buffer), std::move(result)};
  }
  size_t hold_nothing(size_t i) {
    keep(i, nullptr, pyb::none());
    return i;
  }

  std::shared_ptr<Client> m_client;
  std::unique_ptr<Batch> m_batch;
  std::unique_ptr<Batch> m_done;  // finished: kept for status() and value()
  std::vector<Held> m_held;       // per operation
};

}  // namespace

pyb::object batch_object(std::shared_ptr<Client> client, std::optional<QosClass> qos) {
  return pyb::cast(std::make_unique<PyBatch>(std::move(client), qos));
}

void bind_batch(pyb::module_& m) {
  pyb::class_<PyBatch>(m, "Batch",
                       "Operations posted together (client.batch()): each returns its index; wait() waits for all "
                       "and raises the first error; status(i), value(i), result(i) per operation. As a context "
                       "manager, leaving the block waits. Buffers are held until the batch is done.")
      .def("write", &PyBatch::write, arg("gva"), arg("data"))
      .def("read", &PyBatch::read, arg("gva"), arg("length"))
      .def("read_into", &PyBatch::read_into, arg("gva"), arg("buffer"))
      .def("fetch_add", &PyBatch::fetch_add, arg("gva"), arg("value"))
      .def("compare_swap", &PyBatch::compare_swap, arg("gva"), arg("expected"), arg("desired"))
      .def("fence", &PyBatch::fence, "What is posted after starts once all posted before has completed.")
      .def("submit", &PyBatch::submit,
           "Sends what was posted: it runs on a library thread while Python goes on (wait() or done to finish).")
      .def("wait", &PyBatch::wait, arg("timeout") = 600.0)
      .def_property_readonly("done", &PyBatch::done)
      .def("__len__", &PyBatch::size)
      .def("status", &PyBatch::status, arg("index"))
      .def("value", &PyBatch::value, arg("index"))
      .def("result", &PyBatch::result, arg("index"))
      .def("__enter__", [](pyb::object self) { return self; })
      .def("__exit__", [](PyBatch& b, pyb::handle, pyb::handle, pyb::handle) {
        b.finish();
        return false;
      });
}

}  // namespace tiermem::py
