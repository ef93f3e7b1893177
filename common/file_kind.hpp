// What kind of file a stat mode is, in words for messages ("/etc/passwd is
// not a socket (a regular file)"). Header-only: tiermemctl, which sees only
// libtiermem's public API, uses it too.
#pragma once

#include <sys/stat.h>

#include <string>

namespace tiermem {

inline std::string file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

}  // namespace tiermem
