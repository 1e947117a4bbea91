/* Test target: the user's own pool allocator over malloc'd slabs, for --alloc-fn / --free-fn.
 * tests/test_allocators_bpf.py holds the figures.
 *
 *   pool [--linger]   prints "ready <pid>", waits for SIGUSR1, works in thread "pooler", prints
 *                     "done slabs=<n>"; with --linger it then sleeps until killed.
 *
 *   pool_get(pool, size)            returns the object (NULL on failure)      size=arg1
 *   pool_get_out(pool, &out, size)  stores it at *out, returns 0 or -1         size=arg2,out=arg1
 *   pool_calloc(pool, count, size)  count x size bytes, zeroed                 count=arg1,size=arg2
 *   pool_put(pool, obj)                                                        ptr=arg1
 * Objects come from 64 KiB slabs the pool mallocs in pool_new_slab (a heap site).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common.h"

#define NOINLINE __attribute__((noinline))
#define SLAB (64 * 1024)

struct free_obj { struct free_obj *next; size_t size; };
struct pool { char *slab; size_t used; struct free_obj *free; int slabs; };

NOINLINE char *pool_new_slab(struct pool *p)
{
    p->slabs++;
    return malloc(SLAB);
}

NOINLINE void *pool_get(struct pool *p, size_t size)
{
    if (size == 0 || size > SLAB)
        return NULL;
    for (struct free_obj **f = &p->free; *f; f = &(*f)->next)
        if ((*f)->size == size) {
            void *o = *f;
            *f = (*f)->next;
            return o;
        }
    size = (size + 15) & ~(size_t)15;
    if (!p->slab || p->used + size > SLAB) {
        p->slab = pool_new_slab(p);
        p->used = 0;
    }
    void *o = p->slab + p->used;
    p->used += size;
    return o;
}

NOINLINE int pool_get_out(struct pool *p, void **out, size_t size)
{
    void *o = pool_get(p, size);
    if (!o)
        return -1;
    *out = o;
    return 0;
}

NOINLINE void *pool_calloc(struct pool *p, size_t count, size_t size)
{
    void *o = pool_get(p, count * size);
    if (o)
        memset(o, 0, count * size);
    return o;
}

NOINLINE void pool_put(struct pool *p, void *obj, size_t size)
{
    struct free_obj *f = obj;
    f->size = size;
    f->next = p->free;
    p->free = f;
}

static struct pool pool;
void *volatile sink;

NOINLINE void pool_objects(void)
{
    void *o[100];
    for (int i = 0; i < 100; i++)
        o[i] = pool_get(&pool, 200);
    for (int i = 0; i < 40; i++)
        pool_put(&pool, o[i], 200); /* 60 x 200 stay */
}

NOINLINE void pool_out(void)
{
    void *o;
    for (int i = 0; i < 7; i++)
        if (pool_get_out(&pool, &o, 300) == 0)
            sink = o;
    if (pool_get_out(&pool, &o, 0) == 0) /* fails (-1): not an allocation */
        exit(2);
}

NOINLINE void pool_zeroed(void)
{
    for (int i = 0; i < 5; i++)
        sink = pool_calloc(&pool, 3, 50);
}

static void *pooler(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "pooler");
    pool_objects();
    pool_out();
    pool_zeroed();
    return NULL;
}

int main(int argc, char **argv)
{
    int linger = argc > 1 && !strcmp(argv[1], "--linger");
    sigset_t set;
    block_usr1(&set);
    signal(SIGUSR1, on_usr1);
    ready_wait_usr1(&set);
    pthread_t t;
    pthread_create(&t, NULL, pooler, NULL);
    pthread_join(t, NULL);
    printf("done slabs=%d\n", pool.slabs);
    flush_linger(linger);
    return 0;
}
