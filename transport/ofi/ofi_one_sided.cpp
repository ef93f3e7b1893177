// The libfabric transport's one-sided path: regions registered with the
// provider (fi_mr_reg), gets, puts and 64-bit atomics run by the peer's NIC
// (fi_read, fi_writemsg with FI_DELIVERY_COMPLETE, fi_fetch_atomic,
// fi_compare_atomic), on providers that check keys in hardware and have
// those atomics. Conditional adds, persists and groups stay on messages (as
// over UCX's RDMA). See ofi_internal.hpp and docs/design/libfabric.md.
#include <algorithm>
#include <cstring>

#include "transport/ofi/ofi_internal.hpp"

namespace tiermem::ofi_detail {

std::string one_sided_mode(const OfiOptions& options) {
  const std::string& m = options.one_sided;
  return m == "auto" || m == "off" || m == "unchecked" ? m : "";
}

bool checks_keys(const std::string& provider) {
  // efa: a protection domain per fi_domain, keys checked by the NIC; verbs:
  // the same through rxm; cxi: keys within a VNI (the domain's auth_key).
  // Not a property fi_getinfo reports: shm answers a read with a wrong key
  // (docs/design/libfabric.md, section 7).
  return provider == "efa" || provider == "verbs;ofi_rxm" || provider == "cxi";
}

void OfiTransport::choose_one_sided(const OfiOptions& options, bool rma_caps) {
  const std::string mode = one_sided_mode(options);
  m_one_sided = false;
  if (mode == "off") {
    m_one_sided_why = "messages (one_sided off)";
    return;
  }
  if (mode == "auto" && !checks_keys(m_provider)) {
    m_one_sided_why = "messages (" + m_provider + " checks no keys in hardware)";
    return;
  }
  if (!rma_caps) {
    m_one_sided_why = "messages (no FI_RMA and FI_ATOMIC on a reliable-datagram endpoint)";
    return;
  }
  // 64-bit fetch-add, swap and compare-swap, each at least one word.
  struct Need {
    fi_op op;
    uint64_t flags;
    const char* name;
  };
  for (const Need& n : {Need{FI_SUM, FI_FETCH_ATOMIC, "fetch-add"}, Need{FI_ATOMIC_WRITE, FI_FETCH_ATOMIC, "swap"},
                        Need{FI_CSWAP, FI_COMPARE_ATOMIC, "compare-swap"}}) {
    fi_atomic_attr attr{};
    if (fi_query_atomic(m_domain, FI_UINT64, n.op, &attr, n.flags) != 0 || attr.count < 1) {
      m_one_sided_why = std::string("messages (no 64-bit ") + n.name + ")";
      return;
    }
  }
  const uint64_t mr = m_info->domain_attr->mr_mode;
  m_virt_addr = (mr & FI_MR_VIRT_ADDR) != 0;
  m_prov_key = (mr & FI_MR_PROV_KEY) != 0;
  m_mr_endpoint = (mr & FI_MR_ENDPOINT) != 0;
  m_one_sided = true;
  m_one_sided_why = std::string("one-sided") + (mode == "unchecked" ? " (unchecked: keys not enforced here)" : "");
}

Result<fid_mr*> OfiTransport::register_one_sided(void* base, size_t length, uint64_t* key) {
  // Keys we choose unless the provider does (FI_MR_PROV_KEY); unique in the
  // domain. cxi keeps keys below 100 for its own "optimised" ones.
  const uint64_t requested = m_next_key.fetch_add(1) + 100;
  fid_mr* mr = nullptr;
  int rc = fi_mr_reg(m_domain, base, length, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, requested, 0, &mr, nullptr);
  if (rc != 0) return ofi_error("registering " + std::to_string(length) + " bytes (fi_mr_reg)", rc);
  if (m_mr_endpoint) {
    rc = fi_mr_bind(mr, &m_ep->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc != 0) {
      fi_close(&mr->fid);
      return ofi_error("binding a registration to the endpoint (FI_MR_ENDPOINT)", rc);
    }
  }
  *key = fi_mr_key(mr);
  if (*key == FI_KEY_NOTAVAIL) {
    fi_close(&mr->fid);
    return Status(ErrorCode::not_supported, "libfabric provider " + m_provider +
                                                " keys regions with more than 64 bits (FI_MR_RAW), which tiermem's "
                                                "keys do not carry");
  }
  return mr;
}

namespace {
Status peer_down() {
  return Status(ErrorCode::transport_error, "the peer's endpoint failed (peer down or unreachable)");
}
}  // namespace

Status OfiTransport::rma_get(OfiBatch& b, OfiEndpoint& ep, void* dst, size_t length, uint64_t remote_addr,
                             OfiRemoteKey& key) {
  if (ep.failed()) return peer_down();
  auto op = std::make_unique<OfiRma>();
  op->ep = &ep;
  op->waiter = &Waiter::of_this_thread();
  op->dst = dst;
  op->staging = m_pool.take(length);
  OfiRma& r = *op;
  const uint64_t addr = remote_addr - key.m_offset_base;
  const ssize_t rc = post_retrying(
      [&] { return fi_read(m_ep, r.staging.data(), length, nullptr, ep.m_addr, addr, key.m_key, &r.ctx.fi); },
      std::chrono::steady_clock::now() + std::chrono::seconds(5));
  if (rc != 0) return ofi_error("posting a read", static_cast<int>(rc));
  b.m_rma.push_back(std::move(op));
  return Status();
}

Status OfiTransport::rma_put(OfiBatch& b, OfiEndpoint& ep, const void* src, size_t length, uint64_t remote_addr,
                             OfiRemoteKey& key) {
  if (ep.failed()) return peer_down();
  auto op = std::make_unique<OfiRma>();
  op->ep = &ep;
  op->waiter = &Waiter::of_this_thread();
  op->staging = m_pool.take(length);
  std::memcpy(op->staging.data(), src, length);
  OfiRma& r = *op;
  iovec iov{r.staging.data(), length};
  fi_rma_iov target{remote_addr - key.m_offset_base, length, key.m_key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.iov_count = 1;
  msg.addr = ep.m_addr;
  msg.rma_iov = &target;
  msg.rma_iov_count = 1;
  msg.context = &r.ctx.fi;
  // Completed means visible at the target (what wait() and a fence promise).
  const ssize_t rc = post_retrying([&] { return fi_writemsg(m_ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE); },
                                   std::chrono::steady_clock::now() + std::chrono::seconds(5));
  if (rc != 0) return ofi_error("posting a write", static_cast<int>(rc));
  b.m_rma.push_back(std::move(op));
  return Status();
}

Status OfiTransport::rma_atomic(OfiBatch& b, OfiEndpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                                uint64_t remote_addr, OfiRemoteKey& key, uint64_t* result) {
  if (ep.failed()) return peer_down();
  auto a = std::make_unique<OfiRma>();
  a->ep = &ep;
  a->waiter = &Waiter::of_this_thread();
  a->result = result;
  a->operand = operand;
  a->compare = compare;
  OfiRma& r = *a;
  const uint64_t addr = remote_addr - key.m_offset_base;
  const ssize_t rc = post_retrying(
      [&]() -> ssize_t {
        if (op == AtomicOp::compare_swap) {
          return fi_compare_atomic(m_ep, &r.operand, 1, nullptr, &r.compare, nullptr, &r.fetched, nullptr, ep.m_addr,
                                   addr, key.m_key, FI_UINT64, FI_CSWAP, &r.ctx.fi);
        }
        return fi_fetch_atomic(m_ep, &r.operand, 1, nullptr, &r.fetched, nullptr, ep.m_addr, addr, key.m_key,
                               FI_UINT64, op == AtomicOp::swap ? FI_ATOMIC_WRITE : FI_SUM, &r.ctx.fi);
      },
      std::chrono::steady_clock::now() + std::chrono::seconds(5));
  if (rc != 0) return ofi_error("posting an atomic", static_cast<int>(rc));
  b.m_rma.push_back(std::move(a));
  return Status();
}

void OfiTransport::complete_rma(OfiContext* ctx, int error, int prov_errno, const std::string& why) {
  OfiEndpoint* failed = nullptr;
  {
    std::lock_guard lock(m_lock);
    OfiRma& r = *static_cast<OfiRma*>(ctx->owner);
    r.done = true;
    if (r.abandoned) {
      m_rma_quarantine.erase(&r);  // the provider let go of its staging
      return;
    }
    if (error != 0) {
      r.status = Status(ErrorCode::transport_error, "libfabric: " + why);
      if (peer_failed(error, prov_errno)) failed = r.ep;
    }
    r.waiter->wake();
  }
  if (failed != nullptr) report_failure(*failed, why);
}

bool OfiTransport::reap_rma(OfiBatch& b, Status& result) {
  for (auto& op : b.m_rma) {
    OfiRma& r = *op;
    if (r.reaped) continue;
    {
      std::lock_guard lock(m_lock);
      if (!r.done) continue;
    }
    r.reaped = true;
    ++b.m_rma_done;
    if (!r.status.ok()) {
      if (result.ok()) result = r.status;
      continue;
    }
    if (r.dst != nullptr) std::memcpy(r.dst, r.staging.data(), r.staging.size());
    if (r.result != nullptr) *r.result = r.fetched;
  }
  return b.m_rma_done < b.m_rma.size();
}

Status OfiTransport::fence(TransportBatch& batch, std::chrono::milliseconds timeout) {
  // Messages run in order at their target: nothing to order for those. The
  // one-sided operations issued so far complete (delivered) before any
  // after the fence is issued: not every provider orders them, or takes
  // FI_FENCE (rxm).
  auto& b = static_cast<OfiBatch&>(batch);
  Status error;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (reap_rma(b, error)) {
    if (progress_once()) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      abandon(b);
      return Status(ErrorCode::timeout, "one-sided operations did not complete within " +
                                            std::to_string(timeout.count()) + " ms (a fence)");
    }
  }
  return error;
}

}  // namespace tiermem::ofi_detail
