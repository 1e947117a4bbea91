/* allocscope BPF, watch.bpf.c: the night watch's gate (allocscope watch, tracer/watch/gate.py).
 *
 * A program of its own, apart from allocscope.c: it is loaded for the watcher's whole life, also
 * while no recording runs. When a process execs a program whose name (comm, set by the exec) is
 * watched, it is stopped before its first instruction (SIGSTOP from the exec tracepoint, delivered
 * on the way back to user space) and its pid is put in `held`: the watcher attaches its probes to
 * it and lets it run, so a restarted daemon is traced from its first allocation. The watcher
 * releases (SIGCONT) every pid in `held` it does not follow; a guardian process holding only this
 * map's fd does it when the watcher itself is killed. */
#include <uapi/linux/ptrace.h>

#define WATCH_SIGSTOP 19
#define WATCH_COMMS 64
#define WATCH_HELD 1024

struct watch_comm {
    char comm[16];
};

struct watch_event {
    u32 pid;
    u32 kind; /* 1: stopped at its exec */
    u64 ts_ns;
};

BPF_HASH(watched, struct watch_comm, u8, WATCH_COMMS);
BPF_HASH(held, u32, u64, WATCH_HELD);
BPF_ARRAY(watch_counts, u64, 2); /* 0: holds, 1: holds refused (held table full) */
BPF_RINGBUF_OUTPUT(watch_events, 4);

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    struct watch_comm key = {};
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    if (!watched.lookup(&key))
        return 0;
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    u64 now = bpf_ktime_get_ns();
    int slot = 0;
    /* never stop a process the watcher might not know of: only with its pid in `held` */
    if (held.insert(&pid, &now) != 0) {
        slot = 1;
        u64 *n = watch_counts.lookup(&slot);
        if (n)
            __sync_fetch_and_add(n, 1);
        return 0;
    }
    bpf_send_signal(WATCH_SIGSTOP);
    u64 *n = watch_counts.lookup(&slot);
    if (n)
        __sync_fetch_and_add(n, 1);
    struct watch_event ev = {.pid = pid, .kind = 1, .ts_ns = now};
    watch_events.ringbuf_output(&ev, sizeof(ev), 0);
    return 0;
}
