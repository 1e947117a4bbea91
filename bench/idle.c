/* A small idle daemon for bench/first_contact.py: two threads, a malloc/free every 10 ms each. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *work(void *arg)
{
    size_t n = (size_t)arg;
    for (;;) {
        char *p = malloc(n);
        if (p)
            memset(p, 1, n);
        usleep(10000);
        free(p);
    }
    return NULL;
}

int main(void)
{
    pthread_t t;
    pthread_create(&t, NULL, work, (void *)4099);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    work((void *)1013);
    return 0;
}
