// The two ends of a rank's run: --restart forgetting an earlier run, and the
// job's end freeing the rank's memory (unless --keep).
//
// Freeing waits for every other rank: they may still poll this rank's
// control words (its barrier) until they finish their own last step. Each
// rank raises its k_done word to the job's steps when it is through, and
// frees once every peer's k_done is there or the peer's control words are
// gone (that peer saw the same and freed first).
#include <cinttypes>
#include <cstdio>
#include <thread>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "executor/runtime/control/trainer_impl.hpp"

namespace tiermem::exec {
namespace {

bool gone(const Status& s) {
  return s.code() == ErrorCode::not_allocated || s.code() == ErrorCode::stale_generation ||
         s.code() == ErrorCode::not_found;
}

}  // namespace

Status Trainer::forget_earlier_run() {
  const std::string prefix = m_dir->name(m_env.rank, "");
  TIERMEM_ASSIGN_OR_RETURN(const std::vector<AllocationInfo> all, m_client->list());
  int freed = 0;
  for (const AllocationInfo& a : all) {
    if (a.name.rfind(prefix, 0) != 0 || a.replica_of.node != 0) continue;  // copies go with their home
    TIERMEM_RETURN_IF_ERROR(m_client->free(a.gva).with_context("--restart: freeing " + a.name));
    ++freed;
  }
  if (!m_opt.quiet) {
    std::fprintf(stderr, "rank %d: --restart: freed %d allocation(s) of an earlier run of job '%s'\n", m_env.rank,
                 freed, m_opt.job.c_str());
  }
  return Status();
}

Status Trainer::finish() {
  const auto total = static_cast<uint64_t>(m_job.total_steps);
  TIERMEM_RETURN_IF_ERROR(m_dir->raise(m_arenas.ctl_region().gva.plus(8 * k_done), total));
  if (m_opt.keep) {
    if (!m_opt.quiet) {
      std::fprintf(stderr, "rank %d: the job's memory stays (--keep): `tiermemctl free --name-prefix %s` frees it\n",
                   m_env.rank, m_dir->name(m_env.rank, "").c_str());
    }
    return Status();
  }
  const auto deadline = std::chrono::steady_clock::now() + m_opt.timeout;
  for (int p = 0; p < m_env.world; ++p) {
    if (p == m_env.rank) continue;
    auto ctl = m_dir->peer(p, "ctl");
    if (!ctl.ok()) {
      if (gone(ctl.status())) continue;
      return ctl.status().with_context("the job's end (its memory is kept)");
    }
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      auto v = m_dir->load(ctl->plus(8 * k_done));
      if ((v.ok() && *v >= total) || (!v.ok() && gone(v.status()))) break;
      if (std::chrono::steady_clock::now() > deadline) {
        return Status(ErrorCode::timeout,
                      "rank " + std::to_string(p) + " did not finish within " +
                          std::to_string(m_opt.timeout.count() / 1000) +
                          " s of this one: this rank's memory is kept (tiermemctl free --name-prefix " +
                          m_dir->name(m_env.rank, "") + " frees it)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
  uint64_t bytes = 0;
  int freed = 0;
  Status first_error;
  std::vector<Gva> mine = m_arenas.release();
  if (const OwnRegion profile = m_profiles.take_region(); !profile.gva.is_null()) mine.push_back(profile.gva);
  for (const Gva g : mine) {
    auto t = m_client->translate(g);
    const Status s = m_client->free(g);
    if (s.ok()) {
      ++freed;
      if (t.ok()) bytes += t->allocation.size;
    } else if (first_error.ok()) {
      first_error = s.with_context("freeing the job's memory");
    }
  }
  if (!m_opt.quiet) {
    std::fprintf(stderr, "rank %d: freed the job's memory: %d allocation(s), %s\n", m_env.rank, freed,
                 format_size(bytes).c_str());
  }
  return first_error;
}

}  // namespace tiermem::exec
