// Probe of libfabric providers for tiermem's design: hints, mr_mode, atomics,
// wait objects, one-sided RMA between two processes, a wrong key, a dead peer.
// usage: probe PROV [DOMAIN] [mrmode-mask-hex]
#define _GNU_SOURCE
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHK(x)                                                                     \
  do {                                                                             \
    int _r = (int)(x);                                                             \
    if (_r) {                                                                      \
      fprintf(stderr, "[%d] %s = %d (%s)\n", getpid(), #x, _r, fi_strerror(-_r)); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

static struct fi_info* info;
static struct fid_fabric* fab;
static struct fid_domain* dom;
static struct fid_cq* cq;
static struct fid_av* av;
static struct fid_ep* ep;
static int have_wait;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void setup(const char* prov, const char* domain, uint64_t mrmode, int verbose) {
  struct fi_info* hints = fi_allocinfo();
  hints->caps = FI_MSG | FI_RMA | FI_ATOMIC;
  hints->mode = FI_CONTEXT;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = mrmode;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(prov);
  if (domain) hints->domain_attr->name = strdup(domain);
  int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
  if (r) {
    printf("fi_getinfo(%s, mr_mode=0x%lx) = %d %s\n", prov, (unsigned long)mrmode, r, fi_strerror(-r));
    exit(2);
  }
  if (verbose) {
    printf("provider %s domain %s fabric %s\n", info->fabric_attr->prov_name, info->domain_attr->name,
           info->fabric_attr->name);
    printf("  caps: %s\n", fi_tostr(&info->caps, FI_TYPE_CAPS));
    printf("  mode: %s\n", fi_tostr(&info->mode, FI_TYPE_MODE));
    printf("  mr_mode: %s\n", fi_tostr(&info->domain_attr->mr_mode, FI_TYPE_MR_MODE));
    printf("  mr_key_size: %zu  threading: %s  data_progress: %s  control_progress: %s\n",
           info->domain_attr->mr_key_size, (info->domain_attr->threading==FI_THREAD_SAFE?"SAFE":"other"),
           (info->domain_attr->data_progress==FI_PROGRESS_AUTO?"AUTO":"MANUAL"),
           (info->domain_attr->control_progress==FI_PROGRESS_AUTO?"AUTO":"MANUAL"));
    printf("  tx msg_order: %s\n", fi_tostr(&info->tx_attr->msg_order, FI_TYPE_MSG_ORDER));
    printf("  max_order_raw/war/waw: %zu %zu %zu  inject: %zu  max_msg: %zu  addr_format: %s\n",
           info->ep_attr->max_order_raw_size, info->ep_attr->max_order_war_size, info->ep_attr->max_order_waw_size,
           info->tx_attr->inject_size, info->ep_attr->max_msg_size,
           fi_tostr(&info->addr_format, FI_TYPE_ADDR_FORMAT));
  }
  CHK(fi_fabric(info->fabric_attr, &fab, NULL));
  CHK(fi_domain(fab, info, &dom, NULL));
  struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_FD, .size = 1024};
  r = fi_cq_open(dom, &ca, &cq, NULL);
  have_wait = r == 0;
  if (r) {
    if (verbose) printf("  CQ with FI_WAIT_FD: %d %s; using FI_WAIT_NONE\n", r, fi_strerror(-r));
    ca.wait_obj = FI_WAIT_NONE;
    CHK(fi_cq_open(dom, &ca, &cq, NULL));
  } else if (verbose) {
    int fd = -1;
    r = fi_control(&cq->fid, FI_GETWAIT, &fd);
    printf("  CQ with FI_WAIT_FD: ok, FI_GETWAIT = %d fd %d\n", r, fd);
  }
  struct fi_av_attr aa = {.type = FI_AV_TABLE};
  CHK(fi_av_open(dom, &aa, &av, NULL));
  CHK(fi_endpoint(dom, info, &ep, NULL));
  CHK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
  CHK(fi_ep_bind(ep, &av->fid, 0));
  CHK(fi_enable(ep));
  if (verbose) {
    struct {
      enum fi_op op;
      enum fi_datatype dt;
      uint64_t flags;
      const char* name;
    } q[] = {{FI_SUM, FI_UINT64, FI_FETCH_ATOMIC, "fetch SUM u64"},
             {FI_CSWAP, FI_UINT64, FI_COMPARE_ATOMIC, "compare CSWAP u64"},
             {FI_ATOMIC_WRITE, FI_UINT64, FI_FETCH_ATOMIC, "fetch ATOMIC_WRITE (swap) u64"},
             {FI_MSWAP, FI_UINT64, FI_COMPARE_ATOMIC, "compare MSWAP u64"}};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; ++i) {
      struct fi_atomic_attr at = {0};
      r = fi_query_atomic(dom, q[i].dt, q[i].op, &at, q[i].flags);
      printf("  fi_query_atomic %s: %d %s (count %zu)\n", q[i].name, r, r ? fi_strerror(-r) : "ok", at.count);
    }
  }
}

// Waits for one completion; returns 0, or the negative error (and prints it).
static int wait_one(double timeout, const char* what) {
  struct fi_cq_data_entry e;
  double end = now() + timeout;
  for (;;) {
    ssize_t n = have_wait ? fi_cq_sread(cq, &e, 1, NULL, 100) : fi_cq_read(cq, &e, 1);
    if (n == 1) return 0;
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      fi_cq_readerr(cq, &err, 0);
      printf("    %s: CQ error err=%d (%s) prov_errno=%d (%s)\n", what, err.err, fi_strerror(err.err), err.prov_errno,
             fi_cq_strerror(cq, err.prov_errno, err.err_data, NULL, 0));
      return -err.err;
    }
    if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT) {
      printf("    %s: cq read %zd %s\n", what, n, fi_strerror(-n));
      return (int)n;
    }
    if (now() > end) {
      printf("    %s: no completion within %.0f s\n", what, timeout);
      return -FI_ETIMEDOUT;
    }
  }
}

static ssize_t retry(ssize_t r) { return r; }
#define POST(call)                                                    \
  ({                                                                  \
    ssize_t _r;                                                       \
    double _end = now() + 5;                                          \
    while ((_r = (call)) == -FI_EAGAIN && now() < _end) {             \
      struct fi_cq_data_entry _e;                                     \
      (void)fi_cq_read(cq, &_e, 0);                                   \
    }                                                                 \
    retry(_r);                                                        \
  })

struct hello {
  char name[256];
  size_t namelen;
  uint64_t base, key;
  size_t keysize;
};

int main(int argc, char** argv) {
  const char* prov = argv[1];
  const char* domain = argc > 2 && argv[2][0] ? argv[2] : NULL;
  uint64_t mrmode = argc > 3 ? strtoull(argv[3], NULL, 16)
                             : (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT);
  int p2c[2], c2p[2];
  pipe(p2c);
  pipe(c2p);
  pid_t child = fork();
  if (child == 0) {
    // target
    setup(prov, domain, mrmode, 0);
    size_t len = 1 << 20;
    uint64_t* buf = aligned_alloc(4096, len);
    for (size_t i = 0; i < len / 8; ++i) buf[i] = i;
    struct fid_mr* mr;
    CHK(fi_mr_reg(dom, buf, len, FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE, 0, 0x5eed1234, 0, &mr,
                  NULL));
    if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
      CHK(fi_mr_bind(mr, &ep->fid, 0));
      CHK(fi_mr_enable(mr));
    }
    struct hello h = {0};
    h.namelen = sizeof h.name;
    CHK(fi_getname(&ep->fid, h.name, &h.namelen));
    h.base = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)buf : 0;
    h.key = fi_mr_key(mr);
    uint8_t raw[64];
    uint64_t rb = 0;
    h.keysize = sizeof raw;
    int r = fi_mr_raw_attr(mr, &rb, raw, &h.keysize, 0);
    if (r) h.keysize = 0;
    write(c2p[1], &h, sizeof h);
    char c;
    // Serve (progress) until told to stop.
    for (;;) {
      struct fi_cq_data_entry e;
      (void)fi_cq_read(cq, &e, 1);
      fd_set fds;
      FD_ZERO(&fds);
      FD_SET(p2c[0], &fds);
      struct timeval tv = {0, 0};
      if (select(p2c[0] + 1, &fds, NULL, NULL, &tv) > 0) {
        read(p2c[0], &c, 1);
        break;
      }
    }
    fprintf(stderr, "    (target's word 1 = %lu)\n", (unsigned long)buf[1]);
    _exit(0);
  }
  setup(prov, domain, mrmode, 1);
  struct hello h;
  read(c2p[0], &h, sizeof h);
  printf("  target: name %zu bytes, key 0x%lx (requested 0x5eed1234), raw key size %zu, base %s\n", h.namelen,
         (unsigned long)h.key, h.keysize, h.base ? "virtual address" : "0 (offset)");
  fi_addr_t peer;
  int n = fi_av_insert(av, h.name, 1, &peer, 0, NULL);
  printf("  fi_av_insert: %d\n", n);
  size_t len = 1 << 20;
  char* local = aligned_alloc(4096, len);
  uint64_t* words = aligned_alloc(64, 64);
  struct fid_mr *lmr, *wmr;
  CHK(fi_mr_reg(dom, local, len, FI_READ | FI_WRITE | FI_SEND | FI_RECV, 0, 1, 0, &lmr, NULL));
  CHK(fi_mr_reg(dom, words, 64, FI_READ | FI_WRITE, 0, 2, 0, &wmr, NULL));
  if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    CHK(fi_mr_bind(lmr, &ep->fid, 0));
    CHK(fi_mr_enable(lmr));
    CHK(fi_mr_bind(wmr, &ep->fid, 0));
    CHK(fi_mr_enable(wmr));
  }
  void* ld = fi_mr_desc(lmr);
  void* wd = fi_mr_desc(wmr);
  struct fi_context2 ctx;
  // read 64 KiB and check
  double t0 = now();
  ssize_t r = POST(fi_read(ep, local, 65536, ld, peer, h.base, h.key, &ctx));
  printf("  fi_read 64KiB post %zd\n", r);
  if (wait_one(10, "read") == 0)
    printf("  read ok in %.0f us, word 5 = %lu\n", (now() - t0) * 1e6, (unsigned long)((uint64_t*)local)[5]);
  // throughput: 64 reads of 64 KiB, 16 in flight
  {
    struct fi_context2 cs[16];
    int iters = 256, posted = 0, done = 0;
    t0 = now();
    while (done < iters) {
      while (posted < iters && posted - done < 16) {
        r = fi_read(ep, local + (posted % 16) * 65536, 65536, ld, peer, h.base, h.key, &cs[posted % 16]);
        if (r == -FI_EAGAIN) break;
        if (r) {
          printf("post %zd\n", r);
          break;
        }
        ++posted;
      }
      struct fi_cq_data_entry e[16];
      ssize_t k = fi_cq_read(cq, e, 16);
      if (k > 0) done += k;
      else if (k == -FI_EAVAIL) {
        printf("error in bw loop\n");
        break;
      }
    }
    double s = now() - t0;
    printf("  64 KiB reads, 16 in flight: %.2f GB/s\n", iters * 65536.0 / s / 1e9);
  }
  memset(local, 0xab, 4096);
  r = POST(fi_write(ep, local, 4096, ld, peer, h.base + 8192, h.key, &ctx));
  printf("  fi_write post %zd -> %d\n", r, wait_one(10, "write"));
  uint64_t operand = 10;
  t0 = now();
  r = POST(fi_fetch_atomic(ep, &operand, 1, NULL, &words[0], wd, peer, h.base + 8, h.key, FI_UINT64, FI_SUM, &ctx));
  int w = wait_one(10, "fetch_atomic");
  printf("  fi_fetch_atomic SUM post %zd -> %d, old %lu (expect 1) in %.0f us\n", r, w, (unsigned long)words[0],
         (now() - t0) * 1e6);
  uint64_t cmp = 11, desired = 42;
  r = POST(fi_compare_atomic(ep, &desired, 1, NULL, &cmp, NULL, &words[1], wd, peer, h.base + 8, h.key, FI_UINT64,
                             FI_CSWAP, &ctx));
  w = wait_one(10, "compare_atomic");
  printf("  fi_compare_atomic CSWAP post %zd -> %d, old %lu (expect 11)\n", r, w, (unsigned long)words[1]);
  int bad = !(argc > 4 && strcmp(argv[4], "nobad") == 0);
  if (bad) {
  // wrong key
  memset(local, 0, 64);
  r = POST(fi_read(ep, local, 64, ld, peer, h.base + 64, h.key ^ 0x40000, &ctx));
  printf("  read with a wrong key: post %zd\n", r);
  if (r == 0) { w = wait_one(5, "wrong key"); printf("    -> %d, word 0 read = %lu (real: 8)\n", w, (unsigned long)((uint64_t*)local)[0]); }
  // out of range
  r = POST(fi_read(ep, local, 64, ld, peer, h.base + len, h.key, &ctx));
  printf("  read past the region: post %zd\n", r);
  if (r == 0) { w = wait_one(5, "out of range"); printf("    -> %d\n", w); }
  }
  // kill the target mid-stream: post a read, kill, wait
  if (!bad) {
    // a kill while 16 reads of 64 KiB are in flight
    struct fi_context2 cs[16];
    int posted = 0;
    for (int i = 0; i < 16; ++i) if (fi_read(ep, local + i * 65536, 65536, ld, peer, h.base, h.key, &cs[i]) == 0) ++posted;
    kill(child, SIGKILL);
    t0 = now();
    int ok = 0, err = 0;
    for (int i = 0; i < posted; ++i) { if (wait_one(20, "in flight at the kill") == 0) ++ok; else ++err; }
    printf("  in flight at the kill: %d posted, %d completed ok, %d with errors, after %.3f s\n", posted, ok, err, now() - t0);
  } else kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  usleep(100000);
  t0 = now();
  r = POST(fi_read(ep, local, 65536, ld, peer, h.base, h.key, &ctx));
  printf("  read after the target was killed: post %zd\n", r);
  if (r == 0) {
    w = wait_one(20, "dead peer");
    printf("  -> %d after %.2f s\n", w, now() - t0);
  }
  t0 = now();
  r = POST(fi_fetch_atomic(ep, &operand, 1, NULL, &words[0], wd, peer, h.base + 8, h.key, FI_UINT64, FI_SUM, &ctx));
  printf("  atomic after the target was killed: post %zd\n", r);
  if (r == 0) {
    w = wait_one(20, "dead peer atomic");
    printf("  -> %d after %.2f s\n", w, now() - t0);
  }
  return 0;
}
