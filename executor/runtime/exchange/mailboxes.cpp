#include "executor/runtime/exchange/mailboxes.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include <tiermem/batch.h>
#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

int64_t slot_bytes(const Channel& c) { return k_header_bytes + align64(c.bytes); }

// The receiving stage's mailbox: the training slots of every channel into
// it, in channel order, then the evaluation slots of the forward ones.
int64_t mailbox_offset(const JobPlan& job, const Channel& c, bool eval) {
  int64_t offset = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (const Channel& other : job.channels) {
      if (other.to != c.to || (pass == 1 && !other.forward)) continue;
      if (other.id == c.id && pass == (eval ? 1 : 0)) return offset;
      offset += job.micro_batches * slot_bytes(other);
    }
  }
  return offset;
}

}  // namespace


int64_t Mailboxes::bytes(const JobPlan& job) {
  int64_t end = 0;
  for (const Channel& c : job.channels) {
    if (c.to != job.topo.stage()) continue;
    const int64_t slots = job.micro_batches * slot_bytes(c);
    if (c.forward) end = std::max(end, mailbox_offset(job, c, true) + slots);
    end = std::max(end, mailbox_offset(job, c, false) + slots);
  }
  return end;
}

uint64_t Mailboxes::training_sequence(const Channel& c, int mb, int64_t step) const {
  // A receiver waiting for message n then knows messages up to n are written.
  const int k = m_job.plan.message_index(c.forward, mb);
  return static_cast<uint64_t>(step) * static_cast<uint64_t>(m_job.micro_batches) + static_cast<uint64_t>(k) + 1;
}

int64_t Mailboxes::slot_offset(const Channel& c, uint64_t sequence, bool eval) const {
  return mailbox_offset(m_job, c, eval) +
         static_cast<int64_t>((sequence - 1) % static_cast<uint64_t>(m_job.micro_batches)) * slot_bytes(c);
}

const std::byte* Mailboxes::payload(const Channel& c, uint64_t sequence, bool eval) const {
  return m_arenas.mbox().data() + slot_offset(c, sequence, eval) + k_header_bytes;
}

Status Mailboxes::receive(const Channel& c, uint64_t sequence, bool eval) {
  const Tensor& t = m_job.graph.tensors[c.tensor];
  auto span = m_trace.span(SpanKind::comm, t.name);
  TIERMEM_RETURN_IF_ERROR(wait_local(m_arenas.ctl() + sequence_word(c, eval), sequence, m_options.timeout,
                                     "'" + t.name + "' from stage " + std::to_string(c.from) + " (message " +
                                         std::to_string(sequence) + ")"));
  BoundaryHeader h;
  const int64_t at = slot_offset(c, sequence, eval);
  if (in_device_memory()) {
    // Never dereferenced on the host: the header comes over the copy engines.
    TIERMEM_RETURN_IF_ERROR(m_dir.read(m_arenas.mbox().gva.plus(static_cast<uint64_t>(at)), &h, sizeof h));
  } else {
    std::memcpy(&h, m_arenas.mbox().data() + at, sizeof h);
  }
  return check_header(h, t, c.from, sequence);
}

// A boundary message on its way: its batch, and what sending it again needs.
struct Mailboxes::InFlight {
  explicit InFlight(Client& client) : batch(client) {}
  Batch batch;
  BoundaryHeader header;
  Gva at, word;
  const void* data = nullptr;
  size_t bytes = 0;
  uint64_t sequence = 0;
  size_t bump = 0;  // the compare-and-swap's index in the batch
  std::string what;
};

Mailboxes::Mailboxes(const JobPlan& job, const TrainOptions& options, Client& client, JobDirectory& dir,
                     const Arenas& arenas, const RankPeers& peers, Trace& trace)
    : m_job(job), m_options(options), m_client(client), m_dir(dir), m_arenas(arenas), m_peers(peers),
      m_trace(trace) {
  for (const auto& [id, at] : peers.mbox) {
    // A receiver whose tier cannot be told now is taken as VRAM: sends from
    // device memory go as they did before mixed jobs.
    auto t = client.translate(at);
    if (!t.ok() || t->allocation.tier == Tier::vram) m_receiver_device.insert(id);
  }
}

Mailboxes::~Mailboxes() = default;  // a batch on its way is waited for

Status Mailboxes::drain() {
  if (!m_in_flight) return Status();
  std::unique_ptr<InFlight> m = std::move(m_in_flight);
  static const std::string k_send_wait = "send-wait";  // outlives the trace
  auto span = m_trace.span(SpanKind::comm, k_send_wait);
  if (m->batch.wait().ok() && m->batch.value(m->bump) >= m->sequence - 1) return Status();
  // Moved memory, a node restarting, a word behind (a restart): the
  // directory's calls follow and wait; the word goes up to `sequence`.
  Status s = m_dir.write(m->at, &m->header, sizeof m->header);
  if (s.ok()) s = m_dir.write(m->at.plus(k_header_bytes), m->data, m->bytes);
  if (s.ok()) s = m_dir.raise(m->word, m->sequence);
  return s.ok() ? s : s.with_context(m->what);
}

Status Mailboxes::send(const Channel& c, const void* data, uint64_t sequence, bool eval) {
  const Tensor& t = m_job.graph.tensors[c.tensor];
  auto span = m_trace.span(SpanKind::comm, t.name);
  const int receiver = m_job.topo.rank_of(c.to, m_job.topo.replica());
  // The receiver's slot for this sequence is free once it consumed the
  // message micro_batches before.
  const auto slots = static_cast<uint64_t>(m_job.micro_batches);
  if (sequence > slots) {
    TIERMEM_RETURN_IF_ERROR(wait_local(m_arenas.ctl() + consumed_word(c, eval), sequence - slots, m_options.timeout,
                                       "stage " + std::to_string(c.to) + " to consume '" + t.name + "'"));
  }
  BoundaryHeader h;
  h.dtype = static_cast<uint8_t>(t.dtype);
  h.partition = static_cast<uint16_t>(c.from);
  h.elements = t.elements();
  h.sequence = sequence;
  h.shape_hash = shape_hash(t);
  const Gva at = m_peers.mbox.at(c.id).plus(static_cast<uint64_t>(slot_offset(c, sequence, eval)));
  Status s;
  if (in_device_memory()) {
    // The header from here, the payload from the device where it was
    // computed: into a mailbox on this GPU device to device, elsewhere
    // staged by the library.
    s = m_dir.write(at, &h, sizeof h);
    if (s.ok()) s = m_dir.write(at.plus(k_header_bytes), data, static_cast<size_t>(t.bytes()));
  } else {
    // Header and payload from where they are, a fence, the sequence word
    // up by one: one batch, which goes as one message with a barrier when
    // the receiver's mailbox and control words are on another node. It
    // goes while the caller computes; the one before it is done first.
    TIERMEM_RETURN_IF_ERROR(drain());
    auto m = std::make_unique<InFlight>(m_client);
    m->header = h;
    m->at = at;
    m->word = m_peers.ctl_word(receiver, sequence_word(c, eval));
    m->data = data;
    m->bytes = static_cast<size_t>(t.bytes());
    m->sequence = sequence;
    m->what = "sending '" + t.name + "' to rank " + std::to_string(receiver);
    m->batch.write(at, &m->header, sizeof m->header);
    m->batch.write(at.plus(k_header_bytes), data, m->bytes);
    m->batch.fence();
    m->bump = m->batch.compare_swap(m->word, sequence - 1, sequence);
    m->batch.submit();
    m_in_flight = std::move(m);
    return Status();
  }
  if (!s.ok()) return s.with_context("sending '" + t.name + "' to rank " + std::to_string(receiver));
  return m_dir.raise(m_peers.ctl_word(receiver, sequence_word(c, eval)), sequence);
}

void Mailboxes::start_at(int64_t steps) const {
  const uint64_t training = static_cast<uint64_t>(steps) * static_cast<uint64_t>(m_job.micro_batches);
  const uint64_t evals = static_cast<uint64_t>(steps / m_job.steps_per_epoch) * static_cast<uint64_t>(m_job.eval_batches);
  auto set = [&](size_t word, uint64_t value) {
    std::atomic_ref<uint64_t>(m_arenas.ctl()[word]).store(value, std::memory_order_release);
  };
  for (const Channel& c : m_job.channels) {
    if (c.to == m_job.topo.stage()) {
      set(sequence_word(c, false), training);
      if (c.forward) set(sequence_word(c, true), evals);
    }
    if (c.from == m_job.topo.stage()) {
      set(consumed_word(c, false), training);
      if (c.forward) set(consumed_word(c, true), evals);
    }
  }
}

Status Mailboxes::consumed_step(int64_t step) {
  for (const Channel& c : m_job.channels) {
    if (c.to != m_job.topo.stage()) continue;
    const int sender = m_job.topo.rank_of(c.from, m_job.topo.replica());
    // The last message of the step on the channel.
    const uint64_t last = static_cast<uint64_t>(step + 1) * static_cast<uint64_t>(m_job.micro_batches);
    TIERMEM_RETURN_IF_ERROR(m_dir.raise(m_peers.ctl_word(sender, consumed_word(c, false)), last));
  }
  return Status();
}

Status Mailboxes::consumed_eval(uint64_t sequence) {
  for (const Channel& c : m_job.channels) {
    if (c.to != m_job.topo.stage() || !c.forward) continue;
    TIERMEM_RETURN_IF_ERROR(m_dir.raise(m_peers.ctl_word(m_job.topo.rank_of(c.from, 0), consumed_word(c, true)), sequence));
  }
  return Status();
}

Result<uint64_t> Mailboxes::eval_messages_done() {
  uint64_t done = ~uint64_t{0};
  for (const Channel& c : m_job.channels) {
    if (!c.forward || (c.from != m_job.topo.stage() && c.to != m_job.topo.stage())) continue;
    const bool sender = c.from == m_job.topo.stage();
    const int peer = m_job.topo.rank_of(sender ? c.to : c.from, 0);
    TIERMEM_ASSIGN_OR_RETURN(auto v, m_dir.load(m_peers.ctl_word(peer, sender ? sequence_word(c, true)
                                                                                : consumed_word(c, true))));
    done = std::min(done, v);
  }
  return done == ~uint64_t{0} ? 0 : done;
}

}  // namespace tiermem::exec
