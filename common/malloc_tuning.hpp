// For the processes of tiermem (tiermemd, tiermem-exec, tiermemctl), never
// for libtiermem (a library does not set its host's allocator).
#pragma once

namespace tiermem {

// Keeps memory malloc got for large buffers (frames, their payloads, the
// copies of a write on its way) to serve the next ones, instead of giving
// it back to the kernel on free: each page of fresh memory costs a page
// fault on first touch, and a 1 MiB write through the daemon made three
// such buffers on each side, which took 10-30x the copy itself on a
// virtual machine (bench/replication_bench's through_daemon figures).
// What is kept is bounded (glibc's trim threshold, 128 MiB per arena).
void keep_freed_memory_for_reuse();

}  // namespace tiermem
