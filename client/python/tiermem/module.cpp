// tiermem._tiermem: the extension module under the `tiermem` package.
#include "tiermem_config.h"
#include "py_common.hpp"

PYBIND11_MODULE(_tiermem, m) {
  m.doc() = "libtiermem for Python: one memory view over VRAM, DRAM and PMEM of a cluster";
  tiermem::py::bind_errors(m);
  tiermem::py::bind_gva(m);
  tiermem::py::bind_mapping(m);
  tiermem::py::bind_batch(m);
  tiermem::py::bind_client(m);
  m.attr("__version__") = TIERMEM_VERSION;
}
