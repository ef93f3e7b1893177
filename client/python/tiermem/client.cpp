// tiermem.Client and tiermem.connect(): libtiermem's Client, with the GIL
// released while a call waits on memory, the daemon or the network.
#include <pybind11/stl.h>

#include <optional>

#include "py_common.hpp"

namespace tiermem::py {
namespace {

class PyClient {
 public:
  explicit PyClient(std::shared_ptr<Client> client) : m_client(std::move(client)) {}

  // The open client; TransportError (connection_closed) once closed.
  std::shared_ptr<Client> get() const {
    if (!m_client) raise(Status(ErrorCode::connection_closed, "this tiermem.Client is closed"));
    return m_client;
  }
  bool closed() const { return !m_client; }
  void close() {
    std::shared_ptr<Client> gone = std::move(m_client);
    pyb::gil_scoped_release release;
    gone.reset();
  }

 private:
  std::shared_ptr<Client> m_client;
};

Tier tier_of(const std::string& text) { return unwrap(parse_tier(text)); }

std::optional<QosClass> qos_of(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  return unwrap(parse_qos_class(*text));
}

Lifetime lifetime_of(const std::string& text) {
  if (text == "persistent") return Lifetime::persistent;
  if (text == "session") return Lifetime::session;
  raise(Status(ErrorCode::invalid_argument, "lifetime '" + text + "': expected 'persistent' or 'session'"));
}

PyClient& me(pyb::handle self) { return self.cast<PyClient&>(); }

// Runs `op` on the client without the GIL.
template <typename Op>
auto blocking(pyb::handle self, Op op) {
  std::shared_ptr<Client> c = me(self).get();
  pyb::gil_scoped_release release;
  return op(*c);
}

std::shared_ptr<Client> open(const std::optional<std::string>& socket, const std::string& name, bool direct_access,
                             int64_t timeout_ms, int64_t reconnect_timeout_ms) {
  ClientOptions o;
  o.socket_path = socket.value_or("");
  o.client_name = name;
  o.direct_access = direct_access;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  o.reconnect_timeout = std::chrono::milliseconds(reconnect_timeout_ms);
  Result<std::unique_ptr<Client>> client = [&] {
    pyb::gil_scoped_release release;
    return Client::connect(o);
  }();
  return std::shared_ptr<Client>(unwrap(std::move(client)));
}

}  // namespace

void bind_client(pyb::module_& m) {
  using pyb::arg;
  pyb::class_<PyClient>(m, "Client",
                        "A connection to the local tiermemd and, through it, the cluster's memory. Thread-safe; "
                        "calls release the GIL while they wait. As a context manager it closes on exit.")
      .def(pyb::init([](std::optional<std::string> socket, const std::string& name, bool direct_access,
                        int64_t timeout_ms, int64_t reconnect_timeout_ms) {
             return PyClient(open(socket, name, direct_access, timeout_ms, reconnect_timeout_ms));
           }),
           arg("socket") = pyb::none(), arg("name") = "python", arg("direct_access") = true,
           arg("timeout_ms") = 30000, arg("reconnect_timeout_ms") = 30000,
           "Connects to the daemon on `socket` ($TIERMEM_SOCKET, else /run/tiermem/tiermemd.sock). "
           "TransportError (connection_failed) when none answers there.")
      .def_property_readonly("node", [](pyb::handle self) { return me(self).get()->node(); },
                             "The local daemon's node id.")
      .def_property_readonly("page_size", [](pyb::handle self) { return me(self).get()->page_size(); })
      .def_property_readonly("closed", [](pyb::handle self) { return me(self).closed(); })
      .def("close", [](pyb::handle self) { me(self).close(); },
           "Closes the connection (mappings made through it stay valid until closed themselves).")
      .def("__enter__", [](pyb::object self) { return self; })
      .def("__exit__",
           [](pyb::handle self, pyb::handle, pyb::handle, pyb::handle) {
             me(self).close();
             return false;
           })
      .def(
          "alloc",
          [](pyb::object self, uint64_t size, const std::string& tier, std::optional<NodeId> node,
             std::optional<std::string> name, bool strict, bool coherent, const std::string& lifetime,
             uint32_t replicas, const std::string& qos, bool demotable) {
            AllocOptions o{.tier = tier_of(tier), .strict = strict, .name = name.value_or(""),
                           .node = node.value_or(0), .coherent = coherent, .lifetime = lifetime_of(lifetime),
                           .replicas = replicas, .qos = unwrap(parse_qos_class(qos)), .demotable = demotable};
            AllocationInfo info = unwrap(blocking(self, [&](Client& c) { return c.alloc(size, o); }));
            return allocation_object(info, self);
          },
          arg("size"), arg("tier") = "auto", arg("node") = pyb::none(), arg("name") = pyb::none(),
          arg("strict") = false, arg("coherent") = false, arg("lifetime") = "persistent", arg("replicas") = 0,
          arg("qos") = "standard", arg("demotable") = false,
          "Allocates `size` bytes (rounded up to pages) in `tier` ('auto', 'vram', 'dram', 'pmem') on `node` "
          "(None: this one). strict: no fallback to a slower tier. coherent: for atomics from many clients. "
          "lifetime 'session': freed when this client goes. replicas: copies on other nodes. qos: the default "
          "class of calls on it ('standard', 'strict', 'best_effort', 'graceful_degrade'). demotable: its cold pages may "
          "move to the next tier down under capacity pressure (the daemon's [demotion]).")
      .def(
          "free", [](pyb::handle self, pyb::handle gva) {
            const Gva g = as_gva(gva);
            check(blocking(self, [&](Client& c) { return c.free(g); }));
          },
          arg("gva"), "Frees the allocation that starts at `gva`.")
      .def(
          "lookup",
          [](pyb::object self, const std::string& name, NodeId node) {
            AllocationInfo info = unwrap(blocking(self, [&](Client& c) { return c.lookup(name, node); }));
            return allocation_object(info, self);
          },
          arg("name"), arg("node") = 0, "The allocation named `name` on `node` (0: this one).")
      .def(
          "write",
          [](pyb::handle self, pyb::handle gva, pyb::handle data, std::optional<std::string> qos) {
            const Gva g = as_gva(gva);
            const std::optional<QosClass> q = qos_of(qos);
            HostBuffer buffer(data, false, "write");
            check(blocking(self, [&](Client& c) {
              return q ? c.write(g, buffer.data(), buffer.size(), *q) : c.write(g, buffer.data(), buffer.size());
            }));
          },
          arg("gva"), arg("data"), arg("qos") = pyb::none(),
          "Copies the bytes of `data` (buffer protocol or __dlpack__ on the host: bytes, bytearray, numpy, "
          "torch) to `gva`. The range must lie inside one allocation.")
      .def(
          "read",
          [](pyb::handle self, pyb::handle gva, size_t length, std::optional<std::string> qos) {
            const Gva g = as_gva(gva);
            const std::optional<QosClass> q = qos_of(qos);
            pyb::bytes out = pyb::reinterpret_steal<pyb::bytes>(
                PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(length)));
            if (!out) throw pyb::error_already_set();
            char* p = PyBytes_AS_STRING(out.ptr());
            check(blocking(self, [&](Client& c) { return q ? c.read(g, p, length, *q) : c.read(g, p, length); }));
            return out;
          },
          arg("gva"), arg("length"), arg("qos") = pyb::none(), "Reads `length` bytes at `gva` into new bytes.")
      .def(
          "read_into",
          [](pyb::handle self, pyb::handle gva, pyb::handle buffer, std::optional<std::string> qos) {
            const Gva g = as_gva(gva);
            const std::optional<QosClass> q = qos_of(qos);
            HostBuffer target(buffer, true, "read_into");
            check(blocking(self, [&](Client& c) {
              return q ? c.read(g, target.data(), target.size(), *q) : c.read(g, target.data(), target.size());
            }));
            return target.size();
          },
          arg("gva"), arg("buffer"), arg("qos") = pyb::none(),
          "Fills the writable `buffer` (bytearray, numpy array, torch tensor on the host) from `gva`; returns "
          "the bytes read.")
      .def(
          "fetch_add",
          [](pyb::handle self, pyb::handle gva, uint64_t value, std::optional<std::string> qos) {
            const Gva g = as_gva(gva);
            const std::optional<QosClass> q = qos_of(qos);
            return unwrap(blocking(self, [&](Client& c) { return q ? c.fetch_add(g, value, *q) : c.fetch_add(g, value); }));
          },
          arg("gva"), arg("value"), arg("qos") = pyb::none(),
          "Adds `value` to the 8-byte aligned word at `gva` (modulo 2**64); returns the word before.")
      .def(
          "compare_swap",
          [](pyb::handle self, pyb::handle gva, uint64_t expected, uint64_t desired, std::optional<std::string> qos) {
            const Gva g = as_gva(gva);
            const std::optional<QosClass> q = qos_of(qos);
            return unwrap(blocking(self, [&](Client& c) {
              return q ? c.compare_swap(g, expected, desired, *q) : c.compare_swap(g, expected, desired);
            }));
          },
          arg("gva"), arg("expected"), arg("desired"), arg("qos") = pyb::none(),
          "Stores `desired` when the word at `gva` equals `expected`; returns the word before (== expected "
          "when it was stored).")
      .def(
          "batch",
          [](pyb::handle self, std::optional<std::string> qos) { return batch_object(me(self).get(), qos_of(qos)); },
          arg("qos") = pyb::none(),
          "A tiermem.Batch: post reads, writes and atomics, then wait() (or leave its with-block).")
      .def(
          "map",
          [](pyb::handle self, pyb::handle gva) {
            const Gva g = as_gva(gva);
            return mapping_object(unwrap(blocking(self, [&](Client& c) { return c.map(g); })));
          },
          arg("gva"),
          "Maps the allocation starting at `gva` into this process: a tiermem.Mapping with the buffer "
          "protocol and __dlpack__ (numpy.asarray(m), torch.from_dlpack(m) are views of the tier's memory).")
      .def(
          "migrate",
          [](pyb::object self, pyb::handle gva, const std::string& tier, NodeId node) {
            const Gva g = as_gva(gva);
            const Tier t = tier_of(tier);
            AllocationInfo info = unwrap(blocking(self, [&](Client& c) { return c.migrate(g, t, node); }));
            return allocation_object(info, self);
          },
          arg("gva"), arg("tier"), arg("node") = 0,
          "Moves the allocation to `tier` on `node` (0: its home) under the same GVA while readers and writers "
          "go on.")
      .def(
          "stat",
          [](pyb::handle self, NodeId node) {
            return node_stat_dict(unwrap(blocking(self, [&](Client& c) { return c.stat(node); })));
          },
          arg("node") = 0, "The node's tiers, allocations and recovery, as a dict.")
      .def(
          "nodes",
          [](pyb::handle self) {
            pyb::list out;
            for (const NodeInfo& n : unwrap(blocking(self, [](Client& c) { return c.nodes(); }))) {
              out.append(node_info_dict(n));
            }
            return out;
          },
          "The cluster as the local daemon sees it, this node first (a list of dicts).")
      .def(
          "health",
          [](pyb::handle self) { return health_dict(unwrap(blocking(self, [](Client& c) { return c.health(); }))); },
          "The health graph: nodes, heartbeat edges, check-in edges.")
      .def(
          "ls",
          [](pyb::object self, NodeId node) {
            pyb::list out;
            for (const AllocationInfo& a : unwrap(blocking(self, [&](Client& c) { return c.list(node); }))) {
              out.append(allocation_object(a, self));
            }
            return out;
          },
          arg("node") = 0, "The allocations of `node` (0: this one) that this client's tenant may see.")
      .def(
          "access_counters",
          [](pyb::handle self) {
            const AccessCounters a = me(self).get()->access_counters();
            pyb::dict d;
            d["direct_local"] = a.direct_local;
            d["direct_remote"] = a.direct_remote;
            d["message"] = a.message;
            d["through_daemon"] = a.through_daemon;
            d["requests_sent"] = a.requests_sent;
            d["staged_device"] = a.staged_device;
            return d;
          },
          "How this client's reads, writes and atomics travelled.")
      .def("__repr__", [](pyb::handle self) {
        PyClient& c = me(self);
        return c.closed() ? std::string("<tiermem.Client closed>")
                          : "<tiermem.Client node " + std::to_string(c.get()->node()) + ">";
      });

  m.def(
      "connect",
      [](std::optional<std::string> socket, const std::string& name, bool direct_access, int64_t timeout_ms,
         int64_t reconnect_timeout_ms) {
        return PyClient(open(socket, name, direct_access, timeout_ms, reconnect_timeout_ms));
      },
      arg("socket") = pyb::none(), arg("name") = "python", arg("direct_access") = true, arg("timeout_ms") = 30000,
      arg("reconnect_timeout_ms") = 30000, "Connects to the local daemon (see Client).");
}

}  // namespace tiermem::py
