// tiermem.Gva, tiermem.Allocation and the dicts of stat(), nodes(), health().
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <functional>

#include "py_common.hpp"

namespace tiermem::py {
namespace {

// An allocation as the library described it, with the Client that made or
// found it (for free() and the context manager).
struct Allocation {
  AllocationInfo info;
  pyb::object client;
};

pyb::object gva_or_none(const Gva& gva) { return gva.is_null() ? pyb::none() : pyb::cast(gva); }

}  // namespace

Gva as_gva(pyb::handle object) {
  if (pyb::isinstance<Gva>(object)) return object.cast<Gva>();
  if (pyb::isinstance<Allocation>(object)) return object.cast<const Allocation&>().info.gva;
  if (pyb::isinstance<pyb::str>(object)) return unwrap(Gva::parse(object.cast<std::string>()));
  throw pyb::type_error("a GVA is a tiermem.Gva, a tiermem.Allocation or its text form ('0001:0000000000200000'), not " +
                        std::string(pyb::str(pyb::type::handle_of(object).attr("__name__"))));
}

pyb::object allocation_object(const AllocationInfo& info, pyb::object client) {
  return pyb::cast(Allocation{info, std::move(client)});
}

pyb::dict node_info_dict(const NodeInfo& n) {
  pyb::dict d;
  d["node"] = n.node;
  d["control_address"] = n.control_address;
  d["state"] = std::string(node_state_name(n.state));
  d["incarnation"] = n.incarnation;
  d["transports"] = n.transports;
  d["last_error"] = n.last_error;
  d["state_since_ms"] = n.state_since_ms;
  d["health"] = std::string(node_health_name(n.health));
  d["health_since_ms"] = n.health_since_ms;
  d["last_heartbeat_ms"] = n.last_heartbeat_ms;
  d["missed_heartbeats"] = n.missed_heartbeats;
  d["heartbeat_rtt_us"] = n.heartbeat_rtt_us;
  return d;
}

pyb::dict node_stat_dict(const NodeStat& s) {
  pyb::dict d;
  d["node"] = s.node;
  d["page_size"] = s.page_size;
  pyb::list tiers;
  for (const TierStat& t : s.tiers) {
    pyb::dict td;
    td["tier"] = std::string(tier_name(t.tier));
    td["capacity_bytes"] = t.capacity_bytes;
    td["used_bytes"] = t.used_bytes;
    td["free_bytes"] = t.free_bytes;
    td["persistent"] = t.persistent;
    td["shareable"] = t.shareable;
    td["backing"] = t.backing;
    td["allocations"] = t.allocations;
    tiers.append(td);
  }
  d["tiers"] = tiers;
  d["allocations"] = s.allocations;
  d["sessions"] = s.sessions;
  d["uptime_ms"] = s.uptime_ms;
  d["daemon_version"] = s.daemon_version;
  d["socket_path"] = s.socket_path;
  d["fabric"] = s.fabric;
  d["locks_broken"] = s.locks_broken;
  d["truncations_repaired"] = s.truncations_repaired;
  d["files_trimmed"] = s.files_trimmed;
  d["trimmed_bytes"] = s.trimmed_bytes;
  pyb::dict r;
  r["durable"] = s.recovery.durable;
  r["memory_adopted"] = s.recovery.memory_adopted;
  r["starts"] = s.recovery.starts;
  r["allocations"] = s.recovery.allocations;
  r["lost_allocations"] = s.recovery.lost_allocations;
  r["lost_pages"] = s.recovery.lost_pages;
  r["elapsed_ms"] = s.recovery.elapsed_ms;
  r["lost"] = s.recovery.lost;
  r["pool"] = s.recovery.pool;
  d["recovery"] = r;
  return d;
}

pyb::dict health_dict(const HealthGraph& g) {
  pyb::dict d;
  pyb::list nodes, edges, check_ins;
  for (const NodeInfo& n : g.nodes) nodes.append(node_info_dict(n));
  for (const HealthEdge& e : g.edges) {
    pyb::dict ed = node_info_dict(e.to);
    ed["from"] = e.from;
    edges.append(ed);
  }
  for (const CheckInEdge& c : g.check_ins) {
    pyb::dict cd;
    cd["node"] = c.node;
    cd["session"] = c.session;
    cd["client_name"] = c.client_name;
    cd["pid"] = c.pid;
    cd["uid"] = c.uid;
    cd["tenant"] = c.tenant;
    cd["health"] = std::string(node_health_name(c.health));
    cd["last_checkin_ms"] = c.last_checkin_ms;
    cd["missed"] = c.missed;
    cd["interval_ms"] = c.interval_ms;
    check_ins.append(cd);
  }
  d["nodes"] = nodes;
  d["edges"] = edges;
  d["check_ins"] = check_ins;
  d["unasked"] = g.unasked;
  return d;
}

void bind_gva(pyb::module_& m) {
  pyb::class_<Gva>(m, "Gva",
                   "A 128-bit global virtual address: node, generation and offset. Printable and parsable: "
                   "tiermem.Gva('0001:0000000000200000'); the text form carries node and offset, a parsed GVA "
                   "has generation 0 (not checked). gva + n is the address n bytes further on.")
      .def(pyb::init([](const std::string& text) { return unwrap(Gva::parse(text)); }), pyb::arg("text"),
           "Parses the text form; AddressError (bad_gva) quotes what was wrong.")
      .def(pyb::init([](NodeId node, uint32_t generation, uint64_t offset) {
             return Gva{.node = node, .generation = generation, .offset = offset};
           }),
           pyb::arg("node"), pyb::arg("generation"), pyb::arg("offset"))
      .def_readonly("node", &Gva::node)
      .def_readonly("generation", &Gva::generation)
      .def_readonly("offset", &Gva::offset)
      .def_property_readonly("is_null", &Gva::is_null)
      .def("__add__", [](const Gva& g, uint64_t bytes) { return g.plus(bytes); }, pyb::arg("bytes"))
      .def("__str__", &Gva::to_string)
      .def("__repr__",
           [](const Gva& g) {
             if (g.generation == 0) return "tiermem.Gva('" + g.to_string() + "')";
             char text[80];
             std::snprintf(text, sizeof text, "tiermem.Gva(%u, %u, 0x%llx)", static_cast<unsigned>(g.node),
                           static_cast<unsigned>(g.generation), static_cast<unsigned long long>(g.offset));
             return std::string(text);
           })
      .def(pyb::self == pyb::self)
      .def("__hash__", [](const Gva& g) {
        return std::hash<uint64_t>{}(g.offset) ^ (std::hash<uint64_t>{}((uint64_t{g.node} << 32) | g.generation) << 1);
      });

  pyb::class_<Allocation>(m, "Allocation",
                          "An allocation as the daemon described it (alloc, lookup, migrate, ls). As a context "
                          "manager it frees the allocation on exit.")
      .def_property_readonly("gva", [](const Allocation& a) { return a.info.gva; })
      .def_property_readonly("size", [](const Allocation& a) { return a.info.size; })
      .def_property_readonly("tier", [](const Allocation& a) { return std::string(tier_name(a.info.tier)); })
      .def_property_readonly("name", [](const Allocation& a) { return a.info.name; })
      .def_property_readonly("pages", [](const Allocation& a) { return a.info.pages; })
      .def_property_readonly("slot_bytes", [](const Allocation& a) { return a.info.slot_bytes; },
                             "A sub-page allocation's size class in a page it shares; 0: whole pages.")
      .def_property_readonly("map_count", [](const Allocation& a) { return a.info.map_count; })
      .def_property_readonly("created_unix_ms", [](const Allocation& a) { return a.info.created_unix_ms; })
      .def_property_readonly("owner_uid", [](const Allocation& a) { return a.info.owner_uid; })
      .def_property_readonly("tenant", [](const Allocation& a) { return a.info.tenant; })
      .def_property_readonly("lifetime", [](const Allocation& a) {
        return std::string(a.info.lifetime == Lifetime::session ? "session" : "persistent");
      })
      .def_property_readonly("lost_pages", [](const Allocation& a) { return a.info.lost_pages; })
      .def_property_readonly("torn_pages", [](const Allocation& a) { return a.info.torn_pages; })
      .def_property_readonly("replicas_wanted", [](const Allocation& a) { return a.info.replicas_wanted; })
      .def_property_readonly("replicas",
                             [](const Allocation& a) {
                               pyb::list out;
                               for (const ReplicaInfo& r : a.info.replicas) {
                                 out.append(pyb::make_tuple(r.node, r.gva, std::string(replica_state_name(r.state))));
                               }
                               return out;
                             },
                             "(node, gva, state) of each copy, as the home knows them")
      .def_property_readonly("replica_of", [](const Allocation& a) { return gva_or_none(a.info.replica_of); })
      .def_property_readonly("qos", [](const Allocation& a) { return std::string(qos_class_name(a.info.qos)); })
      .def_property_readonly("demotable", [](const Allocation& a) { return a.info.demotable; })
      .def("free", [](const Allocation& a) { a.client.attr("free")(a.info.gva); }, "Frees the allocation.")
      .def("__enter__", [](pyb::object self) { return self; })
      .def("__exit__",
           [](const Allocation& a, pyb::handle, pyb::handle, pyb::handle) {
             a.client.attr("free")(a.info.gva);
             return false;
           })
      .def("__repr__", [](const Allocation& a) {
        return "<tiermem.Allocation " + a.info.gva.to_string() + " " + std::to_string(a.info.size) + " bytes " +
               std::string(tier_name(a.info.tier)) + (a.info.name.empty() ? "" : " '" + a.info.name + "'") + ">";
      });
}

}  // namespace tiermem::py
