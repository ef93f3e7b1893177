// The Trainer behind train() (internal to the executor).
#pragma once

#include <map>
#include <set>

#include "executor/runtime/trainer.hpp"

namespace tiermem::exec {

// Words of a rank's control allocation ("ctl", coherent).
enum CtlWord : size_t {
  k_committed = 0,  // steps committed
  k_barrier = 1,    // steps finished (barrier)
  k_published = 2,  // steps whose gradients are published (data parallel)
  k_mesh = 3,       // mesh validation phase reached
  k_ping = 4,       // latency probe from rank 0
  k_pong = 8,       // rank 0: k_pong + r is rank r's answer
  k_channels = 64,  // k_channels + 2w: message sequence of channel word w (receiver's),
                    // k_channels + 2w + 1: sequence consumed (sender's); w = c for
                    // training, c + channels for evaluation messages
};

// The PMEM snapshot (--snapshot-every): words magic, committed step,
// parameter bytes, optimizer bytes; from k_snapshot_header on the committed
// parameters, then the optimizer state.
inline constexpr uint64_t k_snapshot_magic = 0x31305041'4e534d54;  // "TMSNAP01"
inline constexpr int64_t k_snapshot_header = 64;

class Trainer {
 public:
  Trainer(TrainOptions options, RankEnv env) : m_opt(std::move(options)), m_env(env), m_trace(!m_opt.trace.empty()) {}
  Status run();

 private:
  // --- set-up (trainer.cpp)
  Status load();
  Status allocate();
  Status initialise();
  Status find_peers();
  Status check_shapes();
  Status validate_mesh();
  std::string boundary_text() const;

  // --- a step and its messages (trainer_step.cpp)
  Status run_step(int64_t step);
  Status evaluate(int64_t evals_before, double* accuracy);
  // Runs one (op, micro-batch) of the schedule at position `pos` (-1 in
  // evaluation), with what it receives before and sends after. `base` is the
  // sequence base of evaluation messages.
  Status run_scheduled(int op, int mb, int pos, bool eval, uint64_t eval_sequence, int64_t eval_batch);
  Status receive(const Channel& c, uint64_t sequence, bool eval);
  Status send(const Channel& c, int mb, uint64_t sequence, bool eval);
  // Training and evaluation messages have words and slots of their own, so a
  // rank that restarts mid-evaluation never finds a training message
  // overwritten (and the other way round).
  size_t word(const Channel& c, bool eval) const { return c.id + (eval ? m_channels.size() : 0); }
  int64_t mailbox_offset(const Channel& c, bool eval) const;
  Status merge_partials(int tensor, int mb);
  Status all_reduce(int64_t step);
  Status update(int64_t step);
  Status barrier(uint64_t value);
  Status snapshot(int64_t committed);
  void* memory(int tensor, int mb, bool next_params);
  uint64_t sequence_base(const Channel& c, int64_t step) const;
  uint64_t training_sequence(const Channel& c, int mb) const;
  std::byte* slot(const Channel& c, uint64_t sequence, bool eval);
  Status load_batch(int tensor, int mb, bool eval, int64_t eval_batch);
  void count_correct(const float* logits, const int32_t* labels, const std::vector<int64_t>& shape, int64_t eval_batch);

  TrainOptions m_opt;
  RankEnv m_env;
  Trace m_trace;
  std::unique_ptr<Client> m_client;
  std::unique_ptr<JobDirectory> m_dir;
  Graph m_graph;
  Partition m_partition;
  std::vector<std::string> m_split_report;  // ops split into column blocks for balance
  Topology m_topo;
  std::vector<Channel> m_channels;
  MemoryPlan m_plan;
  Split m_data;
  bool m_has_data = false;

  OwnRegion m_ctl, m_info, m_mbox, m_publish, m_params, m_grads, m_optimizer, m_work, m_snapshot;
  int64_t m_params_bytes = 0, m_optimizer_bytes = 0;
  std::map<int, Gva> m_peer_mbox;         // outgoing channel -> receiver's mailbox base
  std::map<int, Gva> m_peer_ctl;          // rank -> its ctl
  int64_t m_slot_bytes_max = 0;

  int64_t m_steps_per_epoch = 1;
  int64_t m_total_steps = 0;
  int64_t m_eval_batches = 0;
  int m_loss_stage = 0;
  std::vector<std::vector<int64_t>> m_epoch_order;  // shuffled train rows per epoch (cached)
  std::vector<int64_t> m_test_order;
  std::set<std::pair<int, int>> m_merged;  // (tensor, mb) partial gradients merged this step
  std::vector<std::byte> m_staging;
  // Per step, filled by the loss op.
  double m_loss_sum = 0;
  int64_t m_correct = 0, m_rows = 0;
  int64_t m_eval_correct = 0, m_eval_rows = 0;
  bool m_resumed = false;
  int64_t m_start_step = 0;
  int64_t m_step = 0;                           // the step being run
  std::vector<std::vector<int>> m_zero_at;      // schedule position -> work placements to zero
  std::map<int, int> m_received_channel;        // activation -> channel bringing it here
  std::map<int, std::vector<int>> m_partials;   // gradient -> channels bringing partial sums here
  std::map<int, int> m_last_writer;             // gradient sent back -> last local op writing it
  std::set<std::pair<int, int>> m_loaded;       // (tensor, mb) loaded in this pass
  bool m_eval_resume = false;                    // first evaluation after a restart: skip what is done
};

}  // namespace tiermem::exec
