/* allocscope BPF, oom.bpf.c: the OOM killer's victims, as the kernel marks them (oom:mark_victim).
 *
 * A program of its own, apart from allocscope.c, loaded beside a recording (tracer/bpf/oom.py):
 * which process an OOM killer chose, when, and its memory at that moment as the kernel counted it
 * (the figures of dmesg's "Killed process ... total-vm anon-rss file-rss shmem-rss" line, kB).
 * A recording whose target died of SIGKILL looks its pid (or one of its threads') up here: found,
 * the kill was the OOM killer's; not found, it was not, whatever the cgroup's counters say (another
 * process of the same cgroup may have been the one chosen). Not filtered by pid: OOM kills are
 * rare, each one writes one entry of a small LRU table, and the victim is not the task running
 * (the allocation that ran out is often another process's). The memory fields are a newer
 * kernel's (this box's 6.18 has them); an older one's tracepoint has only the pid (compiled there
 * without AS_OOM_RSS: the figures stay 0). */
#include <uapi/linux/ptrace.h>

#define OOM_VICTIMS 256

struct oom_victim {
    u64 ts_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
    u64 total_vm_kb;
    u64 anon_rss_kb;
    u64 file_rss_kb;
    u64 shmem_rss_kb;
    u64 pgtables_kb;
    s32 oom_score_adj;
    u32 uid;
};

BPF_TABLE("lru_hash", u32, struct oom_victim, oom_victims, OOM_VICTIMS);

TRACEPOINT_PROBE(oom, mark_victim)
{
    u32 pid = args->pid;
    struct oom_victim v = {};
    v.ts_ns = bpf_ktime_get_ns();
#ifdef AS_OOM_RSS
    v.total_vm_kb = args->total_vm;
    v.anon_rss_kb = args->anon_rss;
    v.file_rss_kb = args->file_rss;
    v.shmem_rss_kb = args->shmem_rss;
    v.pgtables_kb = args->pgtables;
    v.oom_score_adj = args->oom_score_adj;
    v.uid = args->uid;
#endif
    oom_victims.update(&pid, &v);
    return 0;
}
