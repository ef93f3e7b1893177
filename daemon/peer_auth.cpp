#include "daemon/peer_auth.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "common/file_kind.hpp"
#include "common/unique_fd.hpp"

namespace tiermem {

Result<ClusterSecret> ClusterSecret::load(const std::string& path, std::string_view source) {
  const auto bad = [&](const std::string& why) {
    return Status(ErrorCode::config_error, std::string(source) + ": cluster.secret_file = \"" + path + "\": " + why);
  };
  const std::string make = "head -c 32 /dev/urandom | base64 > " + path + "; chmod 600 " + path;
  // O_NONBLOCK: a FIFO named here is refused below, not waited on for ever.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid() && errno == ENOENT) {
    return bad("does not exist; expected a regular file of mode 0600 holding the cluster's secret, the same on "
               "every node (" + make + ")");
  }
  if (!fd.valid()) {
    return bad(std::string("cannot be read (") + std::strerror(errno) +
               "); expected a file of mode 0600 that the daemon's user owns");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return bad(std::string("cannot be read (") + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) {
    return bad("is " + file_kind(st.st_mode) + "; expected a regular file of mode 0600 holding the cluster's secret (" +
               make + ")");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return bad(std::string("mode ") + mode +
               " lets other users read the cluster secret (whoever reads it can join the cluster); expected a "
               "regular file of mode 0600 (chmod 600 " + path + ")");
  }
  std::string key(static_cast<size_t>(std::min<off_t>(st.st_size, 4096)), '\0');
  const ssize_t n = ::read(fd.get(), key.data(), key.size());
  if (n < 0) return bad(std::string("cannot be read (") + std::strerror(errno) + ")");
  key.resize(static_cast<size_t>(n));
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) key.pop_back();
  if (key.size() < 16) {
    return bad("holds " + std::to_string(key.size()) + " byte(s) of secret" + (key.empty() ? " (it is empty)" : "") +
               "; expected at least 16 (" + make + ")");
  }
  return from_bytes(std::move(key));
}

std::string ClusterSecret::proof(std::string_view role, NodeId a, NodeId b, std::string_view nonce_a,
                                 std::string_view nonce_b) const {
  std::string message = "tiermem peer " + std::string(role) + " " + std::to_string(a) + " " + std::to_string(b) + " ";
  message.append(nonce_a);
  message.append(nonce_b);
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t length = 0;
  if (EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, m_key.data(), m_key.size(),
                reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, sizeof out,
                &length) == nullptr) {
    return {};
  }
  return std::string(reinterpret_cast<const char*>(out), length);
}

bool ClusterSecret::verify(std::string_view proof, std::string_view role, NodeId a, NodeId b,
                           std::string_view nonce_a, std::string_view nonce_b) const {
  const std::string expected = this->proof(role, a, b, nonce_a, nonce_b);
  return !expected.empty() && proof.size() == expected.size() &&
         CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

std::string make_nonce() {
  std::string nonce(k_nonce_bytes, '\0');
  size_t got = 0;
  while (got < nonce.size()) {
    const ssize_t n = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return nonce;
}

Status same_fabric(NodeId node, std::string_view theirs, std::string_view ours) {
  const auto name = [](std::string_view f) { return std::string(f.empty() ? "ucx" : f); };
  if (name(theirs) == name(ours)) return Status();
  return Status(ErrorCode::config_error, "node " + std::to_string(node) + " runs its data plane over " + name(theirs) +
                                             " and this node over " + name(ours) +
                                             ": a cluster uses one fabric ([transport] fabric and provider alike on "
                                             "every node)");
}

}  // namespace tiermem
