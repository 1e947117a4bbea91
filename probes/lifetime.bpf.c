/* allocscope BPF, lifetime.bpf.c: threads and process lifetime: renames, exits, exec.
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "common.h"
#include "regions.h"
#include "waits.h"

/* --- threads and process lifetime ----------------------------------------- */

TRACEPOINT_PROBE(task, task_rename)
{
    if (!is_target())
        return 0;
    struct as_event *e = new_event(AS_EV_THREAD_NAME, (u32)args->pid);
    if (!e)
        return 0;
    bpf_probe_read_kernel(&e->comm, sizeof(e->comm), args->newcomm);
    submit(e);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    if (!is_target())
        return 0;
    u32 tid = current_tid();
    sysargs.delete(&tid); /* `inflight` is task storage: the kernel frees it with the thread */
    wait_memo.delete(&tid);
    offcpu.delete(&tid);
    if (args->group_dead) {
        u32 zero = 0, one = 1;
        gone.update(&zero, &one); /* the pid may be reused from now on */
    }
    struct as_event *e = new_event(AS_EV_THREAD_EXIT, tid);
    if (!e)
        return 0;
    e->ret = args->group_dead;
    submit(e);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    if ((bpf_get_current_pid_tgid() >> 32) != AS_TGID)
        return 0;
    if (AS_LAUNCHED) {
        u32 zero = 0, one = 1;
        u32 *a = armed.lookup(&zero);
        if (a && *a == 0) {
            armed.update(&zero, &one); /* the launched command starts: trace from here */
            return 0;
        }
    }
    if (target_gone())
        return 0; /* a reused pid exec'ing: not ours */
    u32 zero_g = 0, one_g = 1;
    gone.update(&zero_g, &one_g); /* the new program is not traced */
    struct as_event *e = new_event(AS_EV_EXEC, current_tid());
    if (!e)
        return 0;
    submit(e);
    return 0;
}
