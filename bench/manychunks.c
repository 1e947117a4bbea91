/* A glibc heap of millions of chunks, for bench/census.py.
 *
 *   manychunks N THREADS   THREADS threads (each its own arena) plus main allocate N small blocks
 *                          in all (16..120 bytes), free every third one, print "ready" and wait.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static long per;

static void *fill(void *arg)
{
    void **p = malloc(per * sizeof(void *));
    for (long i = 0; i < per; i++)
        p[i] = malloc(16 + (i * 8) % 112);
    for (long i = 0; i < per; i += 3)
        free(p[i]);
    (void)arg;
    return p;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 4000000;
    int threads = argc > 2 ? atoi(argv[2]) : 3;
    per = n / (threads + 1);
    pthread_t th[64];
    pthread_barrier_t *b = NULL;
    (void)b;
    for (int t = 0; t < threads && t < 64; t++)
        pthread_create(&th[t], NULL, fill, NULL);
    fill(NULL);
    for (int t = 0; t < threads && t < 64; t++)
        pthread_join(th[t], NULL);
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}
