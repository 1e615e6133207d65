// Read bandwidth of one file's bytes in three kinds of pages: the file's own mapping (how
// llama.cpp and a plain mmap loader read GGUF weights), anonymous 4 KiB pages, and anonymous
// memory advised for transparent huge pages (how `host/src/cpu/huge_pages.rs` holds large CPU
// weights). Two threads stream halves of the buffer with 64-byte AVX-512 loads; the three
// buffers are read in turn, 20 rounds (the best of two passes each), medians printed.
//
//   gcc -O2 -mavx512f -pthread tools/page_bandwidth.c -o /tmp/page_bandwidth
//   /tmp/page_bandwidth model.gguf
#define _GNU_SOURCE
#include <fcntl.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HUGE (2ul << 20)
#define ROUNDS 20
static size_t N;
static char *buf;
static volatile long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *read_half(void *arg) {
    long id = (long)arg;
    size_t per = N / 2;
    char *p = buf + id * per;
    __m512i acc = _mm512_setzero_si512();
    for (size_t i = 0; i < per; i += 64) acc = _mm512_add_epi32(acc, _mm512_load_si512((void *)(p + i)));
    sink += _mm512_reduce_add_epi32(acc);
    return 0;
}

static double pass(void) {
    double best = 1e9;
    for (int r = 0; r < 2; r++) {
        pthread_t t[2];
        double t0 = now();
        for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, read_half, (void *)i);
        for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
        double d = now() - t0;
        if (d < best) best = d;
    }
    return N / best / 1e9;
}

static char *anon(int advice) {
    char *a = mmap(0, N + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); exit(1); }
    a = (char *)(((size_t)a + HUGE - 1) & ~(HUGE - 1));
    madvise(a, N, advice);
    return a;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s FILE\n", argv[0]); return 2; }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror(argv[1]); return 1; }
    N = lseek(fd, 0, SEEK_END) & ~((size_t)(4 << 20) - 1);
    char *file = mmap(0, N, PROT_READ, MAP_PRIVATE, fd, 0);
    if (file == MAP_FAILED) { perror("mmap"); return 1; }
    char *small = anon(MADV_NOHUGEPAGE), *huge = anon(MADV_HUGEPAGE);
    memcpy(small, file, N);
    memcpy(huge, file, N);
    char *bufs[3] = {file, small, huge};
    const char *names[3] = {"file mapping", "anonymous 4 KiB", "anonymous huge"};
    double r[3][ROUNDS];
    for (int i = 0; i < ROUNDS; i++)
        for (int k = 0; k < 3; k++) { buf = bufs[k]; r[k][i] = pass(); }
    for (int k = 0; k < 3; k++) {
        qsort(r[k], ROUNDS, sizeof(double), cmp);
        printf("%-16s median %.1f GB/s (quartiles %.1f, %.1f)\n", names[k], r[k][ROUNDS / 2], r[k][ROUNDS / 4], r[k][3 * ROUNDS / 4]);
    }
    return 0;
}
