// A rank's memory in tiermem (X4, X5, X10): one named allocation per arena of
// its stage's memory plan, found again by name after a restart or created,
// and mapped into the process, so the kernels compute in tier memory itself.
//
//   ctl        control words (coherent: atomics from every rank), CtlWord
//   info       boundary shapes and the mesh check, read by the other ranks
//   mbox       the slots other stages write boundary tensors into
//   publish    gradients published for the other replicas (data parallel)
//   params     two copies: the committed one and the next
//   grads      parameter gradients of the step
//   optimizer  two copies, like params
//   work       per-micro-batch tensors, reused as the plan says
//   window     offload (the plan's budget): parameters streamed in and
//              gradients on their way out (param_stream.hpp); params, grads
//              and optimizer then live in the plan's home tier
//   snapshot   PMEM copy of the committed state (--snapshot-every), two
//              slots; with --replicas N replicated on N other nodes and
//              written every step
//
// A rank started on a node where its control words do not exist, with
// --replicas, looks for its snapshot elsewhere (on the other nodes, or a copy
// of it whose home died) and, when there is one, resumes from it: the
// replacement of a rank whose node died, at the last committed step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <tiermem/client.h>

#include "executor/compute.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/step_report.hpp"

namespace tiermem::exec {

// Words of a rank's control allocation ("ctl", coherent).
enum CtlWord : size_t {
  k_committed = 0,  // steps committed
  k_barrier = 1,    // steps finished (barrier)
  k_published = 2,  // steps whose gradients are published (data parallel)
  k_mesh = 3,       // mesh validation phase reached
  k_ping = 4,       // latency probe from rank 0
  k_done = 5,       // the job's steps, once this rank finished them (its memory may go after)
  k_moved = 6,      // a new generation of the plan: the step it starts at, once this rank copied its state
  k_buckets = 7,    // gradient buckets published (TIERMEM_EXEC_CPU_BUCKETS: bucket_collective.hpp)
  k_pong = 8,       // rank 0: k_pong + r is rank r's answer
  k_channels = 64,  // k_channels + 2w: message sequence of channel word w (receiver's),
                    // k_channels + 2w + 1: sequence consumed (sender's); w = c for
                    // training, c + channels for evaluation messages
};

// The tensor-parallel exchange's control words, after the channels' 4 per
// channel (tp_exchange.hpp: three per member of the group).
inline int64_t tp_ctl_words(const JobPlan& job) { return 3 * static_cast<int64_t>(job.topo.tensor_parallel); }

// Bytes of the info allocation, and where in it the mesh check lives.
inline constexpr int64_t k_info_bytes = 64 << 10;
inline constexpr int64_t k_info_mesh = 32 << 10;  // the mesh check's floats
inline constexpr int64_t k_info_hash = 33 << 10;  // their all-reduced hash
// Three words: the rank's CollectiveAbility, 1 + whether its stage is
// offloaded, and a hash of its GPU's UUID (0: the CPU) (collectives.hpp;
// 0, 0: not published yet).
inline constexpr int64_t k_info_collectives = 34 << 10;
// Three words: k_layout_magic (its last byte the format), a hash of where
// each parameter and optimizer state tensor lies in its arena (tensor name,
// offset, bytes), as the binary that started the job laid them out for its
// model (state_layout), and the same of the parameters alone
// (params_layout). A job resumed from its kept memory must find its own:
// another model, or a tiermem-exec that lays the state out otherwise, would
// read the kept tensors mixed up; `tiermem-exec sample` reads the parameters
// only (and trains nothing, whatever the optimizer was).
inline constexpr int64_t k_info_layout = k_info_collectives + 24;
inline constexpr int64_t k_info_layout_words = 3;
inline constexpr uint64_t k_layout_magic = 0x54'4d'4c'41'59'4f'55'01;  // "TMLAYOU", format 1
uint64_t state_layout(const JobPlan& job);
uint64_t params_layout(const JobPlan& job);
// From 35 KiB on, the step report `tiermemctl job` reads (step_report.hpp).
static_assert(k_step_report_offset >= k_info_layout + 8 * k_info_layout_words &&
              k_step_report_offset + static_cast<int64_t>(sizeof(StepReport)) <= k_info_bytes);

// The PMEM snapshot (--snapshot-every): two slots, snapshot k in slot k % 2.
// A slot: words magic, committed step, parameter bytes, optimizer bytes,
// published-gradient bytes, XXH3 checksum of the rest of the slot; from
// k_snapshot_header on the committed parameters, the optimizer state, then
// (--replicas, data parallel) the gradients this rank published for the step
// before: a rank still reading them when this one died reads them from its
// replacement. A slot is written in one write of all of it, staged in host
// memory (SnapshotImage); one whose writer died part way (its node, its
// daemon) fails its checksum and is never taken for whole: the other slot,
// the snapshot before, is whole then, as the next is written only once the
// last one is.
inline constexpr uint64_t k_snapshot_magic = 0x32305041'4e534d54;  // "TMSNAP02"
inline constexpr int64_t k_snapshot_header = 64;

// A snapshot slot as it is written: header and state, in host memory.
struct SnapshotImage {
  Gva at;  // the slot
  int64_t step = 0;
  std::vector<std::byte> bytes;
};

class Arenas {
 public:
  // Finds or creates every arena of this rank (`mailbox_bytes` of mbox).
  // Errors: those of JobDirectory::own.
  // With --replicas, a rank new on this node resumes from its snapshot
  // elsewhere when there is one. Errors: those of JobDirectory::own and
  // reads of the snapshot.
  // The tensors (params, grads, optimizer, work) and the mailbox go to the
  // VRAM tier when `compute` computes in device memory, else to DRAM;
  // control words stay in DRAM. Errors: also failed_precondition when arenas
  // found again are in another device's memory than `compute`'s.
  Status allocate(JobDirectory& dir, const JobPlan& job, const TrainOptions& options, int64_t mailbox_bytes,
                  Compute& compute);
  // A fresh job: parameters as their init says, optimizer state zero (and
  // the initial parameters dumped when asked), its layout recorded. A
  // resumed one: checks that the committed copies survived and are laid out
  // as this binary lays them out for this model. Errors: failed_precondition.
  Status initialise(const JobPlan& job, const TrainOptions& options, Compute& compute);
  // Where the arenas went, for people: "params 2 x 1.2 MiB, ..., messages
  // 2 MiB in VRAM of cuda:0 (NVIDIA H200); control words in host memory".
  std::string placement(const Compute& compute) const;
  // Unmaps every arena and returns their GVAs, for the job's end to free.
  std::vector<Gva> release();

  // The ctl allocation existed with a committed step: this rank restarted;
  // or it was restored from a snapshot elsewhere (restored_from()).
  bool resumed() const { return m_resumed; }
  // The snapshot this rank was restored from (null: none).
  Gva restored_from() const { return m_restored_from; }
  int64_t committed() const { return static_cast<int64_t>(load_local(ctl() + k_committed)); }
  void commit(int64_t steps) const;

  // The memory of a parameter, optimizer state, parameter gradient or
  // (micro-batch `mb`'s) work tensor; copy `parity` (0, 1) of the
  // double-buffered ones. nullptr: nothing planned for it here.
  void* memory(const JobPlan& job, int tensor, int mb, int64_t parity) const;
  // The committed state of step `committed` as its snapshot slot is to hold
  // it (*image's buffer is reused). The state must be computed (synced).
  void stage_snapshot(int64_t committed, Compute& compute, SnapshotImage* image) const;
  // Stages and writes the snapshot of step `committed` (persisted, and on
  // every copy, on ack); a write a copy did not take (its node died, and is
  // not dropped yet) is tried again.
  Status snapshot(JobDirectory& dir, int64_t committed, Compute& compute) const;
  // Steps between snapshots (0: none); 1 with --replicas.
  int64_t snapshot_every() const { return m_snapshot_every; }
  // Bytes of one snapshot slot.
  int64_t snapshot_slot_bytes() const;

  uint64_t* ctl() const { return m_ctl.as<uint64_t>(); }
  const OwnRegion& ctl_region() const { return m_ctl; }
  const OwnRegion& info() const { return m_info; }
  const OwnRegion& mbox() const { return m_mbox; }
  const OwnRegion& publish() const { return m_publish; }
  const OwnRegion& grads() const { return m_grads; }
  // Bytes of the gradients (the grads mapping may be larger: whole pages in VRAM).
  int64_t grads_bytes() const { return m_grads_bytes; }
  const OwnRegion& work() const { return m_work; }
  const OwnRegion& window() const { return m_window; }

 private:
  Status own(JobDirectory& dir, OwnRegion* out, const std::string& what, int64_t bytes, bool coherent,
             Tier tier = Tier::dram, uint32_t replicas = 0);
  // The snapshot slots among `candidates` whose header is this job's:
  // (GVA of the slot, step), newest first. *older counts the slots in the
  // format before (not taken).
  std::vector<std::pair<Gva, int64_t>> snapshots(JobDirectory& dir, const std::vector<Gva>& candidates,
                                                 int* older) const;
  // Takes the committed state of `step` from the snapshot slot at `slot`.
  // Errors: data_lost when the slot fails its checksum (torn); those of the
  // read.
  Status restore(JobDirectory& dir, Gva slot, int64_t step, Compute& compute);
  // With --replicas, a rank new on this node: resumes from the newest whole
  // snapshot of it elsewhere, if there is one.
  Status resume_elsewhere(JobDirectory& dir, Compute& compute);

  OwnRegion m_ctl, m_info, m_mbox, m_publish, m_params, m_grads, m_optimizer, m_work, m_window, m_snapshot;
  int64_t m_params_bytes = 0, m_optimizer_bytes = 0, m_grads_bytes = 0, m_snapshot_every = 0;
  int64_t m_published_bytes = 0;  // in the snapshot with --replicas (data parallel)
  Tier m_home = Tier::dram;  // of params, grads and optimizer
  std::vector<void*> m_pinned;  // home arenas page-locked by m_pinned_by (offloaded on a GPU)
  Compute* m_pinned_by = nullptr;
  bool m_resumed = false;
  Gva m_restored_from;
};

}  // namespace tiermem::exec
