// Registered memory that same-host peers map themselves (SOFTRDMA_SHARE_MR=1; access_table.h): the whole
// pages of an MR with remote access are moved into a memfd, mapped MAP_SHARED at the same addresses, so a
// peer's one-sided WRITE or READ is one memcpy in its own address space instead of a process_vm_writev
// (a syscall of about 1.2 us here). The application's pointers stay valid; only the pages' backing changes.
//
// The move copies the pages into the memfd and then maps the memfd over them (mremap, one call): a write by
// another thread of the application to those pages between the two is lost, and so is anything that holds
// the old pages pinned (io_uring fixed buffers, another DMA user), which keeps the old pages. That is why it
// is opt-in. Moving back (deregistration of the last MR on the pages) loses nothing: a private mapping of
// the same memfd replaces the shared one in one call, every page becomes a private copy, and the memfd's
// pages are freed, so madvise(MADV_DONTNEED) gives zero pages again. A forked child gets private copies of
// the pages as they were when fork was called (pthread_atfork; the kernel does the same for pinned pages).
// Only pages that are private, anonymous and writable are moved (not the stack, not file or shared
// mappings); the partial pages at an MR's ends, which may hold other objects, are never moved, and the
// peers reach them the ordinary way.
#pragma once

#include <cstdint>
#include <optional>

namespace softrdma::io::shm {

// What a peer needs to map moved pages: the memfd (open in this process as /proc/<pid>/fd/<fd>, checked by
// its inode) and where the pages lie in it and in this process.
struct SharedPages {
  uint64_t id = 0;  // unique in this process for the memfd's life (peers cache mappings by it)
  int fd = -1;
  uint64_t ino = 0;
  uint64_t file_off = 0;  // of `addr` in the memfd
  uint64_t addr = 0;      // first moved byte (page-aligned)
  uint64_t len = 0;       // bytes moved (whole pages)
};

// Whether the environment asks for it (SOFTRDMA_SHARE_MR=1).
bool share_mr_by_env();

// Moves the whole pages of [addr, addr + len) into shared memory, or takes another reference on a move
// that already holds them all. Nothing when there is no whole page, when a page is not private anonymous
// writable memory, when the pages overlap an earlier move only in part, or when a call fails.
std::optional<SharedPages> share_pages(const void* addr, uint64_t len);

// Gives back one reference; the last one moves the pages back to private memory (if the application has
// not unmapped or replaced them meanwhile) and closes the memfd.
void unshare_pages(const SharedPages& p);

// How many moves are live in this process (tests).
uint32_t shared_page_moves();

}  // namespace softrdma::io::shm
