/* allocscope BPF program (BCC dialect).
 *
 * Aggregates in the kernel: every allocation is kept in `live` (address ->
 * size, stack, thread, time) and counted in `sites` per (stack, thread);
 * frees look the address up and are charged back to the allocating site and
 * thread, and to the (allocating, freeing) thread pair in `flows`. Nothing
 * per malloc leaves the kernel. Rare events (mmap family, brk, madvise,
 * malloc_trim, thread names, exit, exec) go through the `events` ring buffer.
 *
 * Parameters (cflags -D..., all set by tracer/bpf/source.py probe_config from the recording's
 * options, tracer/base/options.py, where their defaults live). Load-time constants, each an
 * AS_K(value) (common.h) that tracer/bpf/prebuilt.py rewrites in the program built once:
 *   AS_TGID         process to trace
 *   AS_LAUNCHED     launch mode: ignore everything until the target's exec
 *   AS_FLOOR        the trap floor (benchmarks): every program returns at once
 *   AS_SAMPLE_BYTES byte-weighted sampling, one per N bytes (0: every call)
 *   AS_FAULT_SAMPLE residency mode: one page fault in N
 *   AS_UVM_MAJOR    nvidia-uvm's character major (0: none)
 *   AS_OFF_*        kernel struct offsets from the running kernel's BTF (tracer/bpf/kernel_btf.py)
 * Compile-time (a variant of the build; the sizes only size maps):
 *   AS_MAX_LIVE     outstanding allocations tracked
 *   AS_MAX_STACKS   distinct stacks
 *   AS_MAX_SITES    distinct (stack, thread, source)
 *   AS_MAX_REGIONS  mmap-family allocations accounted here
 *   AS_RING_PAGES   ring buffer size in pages
 *   AS_PAGE_SIZE    the target's page size
 *   AS_UNWIND_DWARF, AS_RSS_TRACEPOINT; AS_SESSION and AS_FAULTS (always: the uprobe-session and
 *   residency programs are compiled in and loaded only where used)
 *
 * Stacks: user stacks are captured in return probes, where the first frame
 * is the return address into the caller, so the immediate caller is never
 * lost (an entry probe's frame-pointer walk skips it). In syscall
 * tracepoints the word at the user stack pointer is kept as a candidate
 * caller frame; the tracer decides whether it is one. capture_stack() is the
 * only place that walks a stack: a DWARF unwinder plugs in there.
 *
 * Files. BCC compiles one source text: tracer/bpf/source.py bpf_text() inlines this file's local
 * includes, recursively, each file once at its first include (BCC rewrites map calls only in
 * its main file); allocscope.h alone stays an #include. The units below hold the programs (the
 * entry points), in this order; the headers they include hold only declarations (types,
 * constants, maps, static inline helpers), and a header includes what it uses, outside any #if.
 *   allocscope.h     every layout shared with the tracer (tracer/base/layout.py reads it)
 *   common.h         the maps every part uses, the target gate, counters
 *   stacks.h         capture_stack(); unwind_dwarf.h, the DWARF unwinder it uses
 *   rss.h            the target's RSS counters
 *   changes.h        which sites changed since the tracer's last read (tracer/record/sitechanges.py)
 *   accounting.h     live blocks, site counters, flows, totals
 *   heap.h           the heap API's call state: entry/return pairing, alloc_done
 *   customfns.h      --alloc-fn / --free-fn: their specs and call state
 *   regions.h        the mmap family accounted in the kernel (regions, releases, the break)
 *   syscalls.h       the mmap family's exits, dispatched to regions.h or an event
 *   waits.h          off-CPU waits by user stack, TLB flushes
 *   faults.h         residency mode: sampled first touches
 *   rss.bpf.c        kmem:rss_stat (AS_RSS_TRACEPOINT)
 *   heap.bpf.c       alloc_return, the entry probes, heap_entry, heap_session, the markers
 *   cuda.bpf.c       the CUDA driver API
 *   customfns.bpf.c  --alloc-fn / --free-fn
 *   syscalls.bpf.c   the syscall tracepoints (mmap, munmap, mremap, brk, madvise), mark_sys
 *   waits.bpf.c      sched:sched_switch, tlb:tlb_flush
 *   lifetime.bpf.c   thread renames, exits, exec
 *   faults.bpf.c     residency mode's perf-event programs
 */
#include "rss.bpf.c"
#include "heap.bpf.c"
#include "cuda.bpf.c"
#include "customfns.bpf.c"
#include "syscalls.bpf.c"
#include "waits.bpf.c"
#include "lifetime.bpf.c"
#include "faults.bpf.c"
