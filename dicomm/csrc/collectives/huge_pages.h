// Large buffers that cross-memory attach reads or writes cost less in transparent huge pages: the
// kernel pins one page per 2 MiB instead of 512 (docs/benchmarks.md). Where the user's allocator gave
// 4 KiB pages, a collective folds the 2 MiB-aligned inside of its buffer into huge pages
// (madvise MADV_COLLAPSE), which copies the buffer once and is nearly free once it is done. That pays
// off only for a buffer used again: where it turns out to be a new allocation at a known address
// every time, or a job passes ever new buffers, the thread stops trying (a bounded cost).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dicomm {

// Per calling thread (a communicator's collective thread); never fails: huge pages are an optimisation.
void collapse_into_huge_pages(uint8_t* buf, size_t bytes);

}  // namespace dicomm
