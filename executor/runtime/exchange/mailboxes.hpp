// Boundary tensors between pipeline stages (X5, X6): every channel into a
// stage has micro_batches slots in the stage's mailbox for training messages
// and (forward channels) as many for evaluation. A sender waits until the
// receiver consumed the message that used the slot before, writes header and
// payload one-sided into the slot, then raises the receiver's sequence word
// for the channel; the receiver waits on that word and reads the slot in
// place. Messages are numbered in the order both ends handle them, so a
// restarted rank recognises what it had already sent or received. On a GPU
// the mailboxes are VRAM: a sender on the same GPU writes the payload device
// to device, the receiver's kernels read it where it landed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <tiermem/client.h>

#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/state/peers.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {



class Mailboxes {
 public:
  Mailboxes(const JobPlan& job, const TrainOptions& options, Client& client, JobDirectory& dir, const Arenas& arenas,
            const RankPeers& peers, Trace& trace);
  ~Mailboxes();

  // Bytes of this stage's mailbox: every channel into it.
  static int64_t bytes(const JobPlan& job);

  // The number of the message of micro-batch `mb` on training channel `c`
  // in step `step` (from 1; forward by ascending micro-batch, gradients by
  // descending, as the schedule handles them).
  uint64_t training_sequence(const Channel& c, int mb, int64_t step) const;

  // Waits for message `sequence` and checks its header. Errors: timeout
  // (naming tensor, stage and message), and check_header's.
  Status receive(const Channel& c, uint64_t sequence, bool eval);
  // The payload of a received message, in place in the mailbox (device
  // memory where in_device_memory()).
  const std::byte* payload(const Channel& c, uint64_t sequence, bool eval) const;
  // Sends `data` (the channel's tensor, in device memory where
  // in_device_memory(), complete: no kernel may still be writing it) as
  // message `sequence`. On the CPU it returns once the message is on its
  // way (one batch on a library thread) and the caller computes meanwhile:
  // `data` must stay as it is until drain() (the memory plan keeps sent
  // tensors to the step's end); the message before it is drained first, so
  // one is in flight at a time and they land in order.
  Status send(const Channel& c, const void* data, uint64_t sequence, bool eval);
  // Waits for the message on its way, if any; when its batch failed (moved
  // memory, a node restarting) sends it again through the directory, which
  // follows and waits.
  Status drain();
  // The mailboxes are VRAM (a GPU job: the tensors are device memory too).
  bool in_device_memory() const { return m_arenas.mbox().mapping.device() >= 0; }
  // Whether channel c's receiver keeps its mailbox in VRAM (a stage on a
  // GPU); false for a CPU stage's host memory (a mixed job).
  bool receiver_in_device(const Channel& c) const { return m_receiver_device.count(c.id) != 0; }

  // Every training message of `step` into this stage is used up: their
  // senders may reuse the slots.
  Status consumed_step(int64_t step);
  // Evaluation message `sequence` on every forward channel into this stage.
  Status consumed_eval(uint64_t sequence);
  // A new generation of the plan (runtime repartitioning, replan.hpp): this
  // stage's words in its new control allocation as a run of this cut would
  // have left them after `steps` steps and their evaluations.
  void start_at(int64_t steps) const;
  // After a restart: the last evaluation message this stage's neighbours
  // already got from it and took from it (0: none).
  Result<uint64_t> eval_messages_done();

 private:
  // Training and evaluation messages have words and slots of their own, so a
  // rank that restarts mid-evaluation never finds a training message
  // overwritten (and the other way round).
  size_t word(const Channel& c, bool eval) const { return c.id + (eval ? m_job.channels.size() : 0); }
  size_t sequence_word(const Channel& c, bool eval) const { return k_channels + 2 * word(c, eval); }
  size_t consumed_word(const Channel& c, bool eval) const { return sequence_word(c, eval) + 1; }
  int64_t slot_offset(const Channel& c, uint64_t sequence, bool eval) const;

  const JobPlan& m_job;
  const TrainOptions& m_options;
  Client& m_client;
  JobDirectory& m_dir;
  const Arenas& m_arenas;
  const RankPeers& m_peers;
  Trace& m_trace;
  struct InFlight;
  std::unique_ptr<InFlight> m_in_flight;
  std::set<int> m_receiver_device;  // outgoing channels whose receiver's mailbox is VRAM
};

}  // namespace tiermem::exec
