// The version words (M4) and L3 sub-block bits (M3) of a node, two files per
// domain in the node's shared-memory directory:
//
//   header.<k>     one page: SegmentHeader (geometry, the domain's memory
//                  generation, the serving daemon's incarnation and liveness)
//   versions.<k>   [ R version words | 2R L3 words ]      R = pages per domain
//
// Domain k holds virtual pages [k*R, (k+1)*R), and each domain belongs to one
// tenant. The daemon maps every domain's words side by side, so the version
// word of page p is words()[p] and its L3 words are l3()[2p] and l3()[2p+1];
// a client maps the files of each domain its tenant may use, and no other:
// the kernel keeps it from another tenant's words.
//
// What the daemon trusts at a start lives where no client writes: a client
// maps its domain's words read-write (it takes page locks in them) but is
// handed its header only through a read-only descriptor of a root-owned
// 0600 file. What a tenant can do to its own files (scribble on its words,
// truncate or grow them) is judged per domain: that domain is made anew, and
// no other.
//
// A restarted daemon with durable metadata takes a domain's files over
// (adopt) when its header carries this node's geometry and the memory
// generation the metadata recorded for the domain, and its words file is
// whole: the words keep their epochs, so what clients cached is still checked
// against the same words. Otherwise the domain's files are made anew with a
// new memory generation (which tells peers that frames lent from that domain
// are gone), and the caller treats its DRAM as lost.
//
// The header tells a client whether the memory is still served by the daemon
// it talks to: `incarnation` is that daemon's, and 0 once the segment was
// retired (a restarted daemon took over the directory). A client checks it
// after taking its page locks and before it writes (pages/seqlock_copy's
// check_owner), so a client of a dead daemon never writes into memory that a
// new one may have handed to someone else.
#pragma once

#include <pthread.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>

#include "common/unique_fd.hpp"
#include "pages/segment_layout.hpp"
#include "tiers/segment_file.hpp"

namespace tiermem {

class VersionSegments {
 public:
  struct Options {
    std::string dir;
    NodeId node = 0;
    uint32_t domains = 1;
    uint64_t pages_per_domain = k_pages_per_domain_unit;  // a multiple of k_pages_per_domain_unit
    uint64_t page_size = 4096;
    uint64_t incarnation = 0;
    // Per domain, the memory generation its files must carry to be taken
    // over (what the durable metadata recorded); 0, or no entry: made anew.
    std::vector<uint64_t> adopt;
  };
  // Takes over each domain's files that Options::adopt allows and that are
  // whole (their words and L3 bits are kept; the header gets this
  // incarnation), and makes the others anew with a fresh memory generation
  // (whatever was there with their names is replaced). Errors:
  // invalid_argument, io_error.
  static Result<std::unique_ptr<VersionSegments>> create(const Options& options);

  // Why domain `d`'s files in `o.dir` cannot be taken over as of memory
  // generation `generation` (""when they can): a missing or foreign header,
  // another geometry or generation, a words file cut short.
  static std::string unadoptable(const Options& o, uint32_t d, uint64_t generation);

  // What retire_stale found.
  struct Retired {
    size_t segments = 0;      // version segments of an earlier daemon, now retired
    size_t locked_pages = 0;  // pages still locked by its clients after the grace period
  };
  // Marks every version segment that an earlier daemon left in `dir` as
  // retired (its clients stop using it), waits up to `grace` for the page
  // locks its clients still hold to be released, and removes the files
  // (`remove`). Segments of the layout before this one (header inside the
  // words file) are retired too. The caller holds the directory's lock.
  static Retired retire_stale(const std::string& dir, std::chrono::milliseconds grace, bool remove = true);

  uint64_t& word(uint64_t page) { return m_words[page]; }
  std::span<uint64_t> words() { return {m_words, pages()}; }
  std::span<uint64_t> l3() { return {m_l3, 2 * pages()}; }
  uint64_t pages() const { return uint64_t{m_domains} * m_pages_per_domain; }
  uint32_t domains() const { return m_domains; }
  // The liveness mutex of a domain's header (for LivenessHolder).
  pthread_mutex_t* alive_mutex(uint32_t domain) const { return &header_of(domain)->alive; }
  uint64_t pages_per_domain() const { return m_pages_per_domain; }
  uint32_t domain_of(uint64_t page) const { return static_cast<uint32_t>(page / m_pages_per_domain); }

  // The words file of a domain (read-write), for a client to map whole
  // (file_bytes() long).
  int fd(uint32_t domain) const { return m_domains_state[domain].words_fd.get(); }
  uint64_t file_bytes() const { return 3 * m_pages_per_domain * sizeof(uint64_t); }
  // A read-only descriptor of a domain's header, for a client to map
  // (k_segment_header_bytes long): it reads the incarnation and liveness
  // there, and can change nothing the daemon trusts.
  int header_fd(uint32_t domain) const { return m_domains_state[domain].header_reader.get(); }
  // A domain's version words, for registration with the transport.
  void* domain_words(uint32_t domain) const { return m_words + uint64_t{domain} * m_pages_per_domain; }
  uint64_t domain_words_bytes() const { return m_pages_per_domain * sizeof(uint64_t); }

  // Domain `d`'s words file cut back to file_bytes() where its tenant grew
  // it (trim_segment); `*path` names it.
  Result<SegmentTrim> trim_words(uint32_t d, std::string* path) const;

  const SegmentHeader& header(uint32_t domain) const;
  void set_tenant(uint32_t domain, std::string_view tenant);
  // Marks every domain as served by no daemon (incarnation 0): a daemon
  // that stops says so before it closes its clients' connections, so that a
  // client learns at once, from the header, that what only this daemon
  // knew (its session allocations, its pins) is gone.
  void retire();
  // The memory generation of a domain's files (new when they were made anew).
  uint64_t memory_generation(uint32_t domain) const { return m_domains_state[domain].generation; }
  std::vector<uint64_t> memory_generations() const;
  // The files an earlier daemon left for the domain were taken over.
  bool adopted(uint32_t domain) const { return m_domains_state[domain].adopted; }
  // Why they were not, when Options::adopt asked for it ("" otherwise).
  const std::string& made_anew_because(uint32_t domain) const { return m_domains_state[domain].why; }

 private:
  VersionSegments() = default;
  SegmentHeader* header_of(uint32_t domain) const;
  // Opens (adopting or making anew) domain `d`'s files and maps them.
  Status open_domain(const Options& o, uint32_t d);

  struct DomainState {
    UniqueFd words_fd, header_fd, header_reader;
    uint64_t generation = 0;
    bool adopted = false;
    std::string why;
  };
  std::string m_dir;
  uint32_t m_domains = 0;
  uint64_t m_pages_per_domain = 0;
  std::vector<DomainState> m_domains_state;
  Reservation m_headers, m_word_space, m_l3_space;
  uint64_t* m_words = nullptr;
  uint64_t* m_l3 = nullptr;
};

// Holds every domain's SegmentHeader::alive on a thread of its own while it
// exists (a robust mutex held by a thread that exits is marked dead too, so
// it cannot be a thread that comes and goes). Destroy it before the
// segments: it unlocks them first.
class LivenessHolder {
 public:
  explicit LivenessHolder(VersionSegments& segments);
  ~LivenessHolder();
  LivenessHolder(const LivenessHolder&) = delete;
  LivenessHolder& operator=(const LivenessHolder&) = delete;

 private:
  struct State;
  std::unique_ptr<State> m_state;
};

}  // namespace tiermem
