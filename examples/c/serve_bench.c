/* Serving figures of the C API (scripts/bench_runtime.sh builds and runs it; bench/runtime.md has them).
 *
 *   serve_bench MODEL.tsr INDIR ITERS WARMUP SECONDS
 *
 * Reads input i from INDIR/i.bin (raw little-endian bytes), then prints one JSON line: the median (p10, p90)
 * of ITERS timed tessera_model_run calls on one thread after WARMUP untimed ones (outputs into buffers
 * allocated once), and runs per second with 1, 2 and 4 threads on the one loaded model, each thread looping
 * for SECONDS with its own output buffers. The same measurement as examples/rust/serve_bench.rs.
 *
 * Build: cc -O2 serve_bench.c -I runtime-c/include -L target/release -ltessera_runtime_c
 *        -Wl,-rpath,target/release -lpthread -o serve_bench
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tessera.h"

static TesseraModel *model;
static TesseraTensor *inputs;
static size_t n_in, n_out;
static atomic_int stop;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, tessera_last_error());
    exit(1);
}

/* Reads exactly `size` bytes of `path` into a new buffer, or exits with a message naming the file. */
static void *read_file(const char *path, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(1);
    }
    void *buf = malloc(size ? size : 1);
    size_t got = fread(buf, 1, size, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (!buf || got != size || extra) {
        fprintf(stderr, "%s: expected %zu bytes\n", path, size);
        exit(1);
    }
    return buf;
}

/* Output buffers for one thread. */
static TesseraTensorMut *new_outputs(void) {
    TesseraTensorMut *outs = calloc(n_out ? n_out : 1, sizeof *outs);
    for (size_t o = 0; o < n_out; o++) {
        TesseraTensorInfo info;
        if (tessera_model_output(model, o, &info) != TESSERA_STATUS_OK) die("output");
        outs[o] = (TesseraTensorMut){info.name, info.dtype, info.rank, info.shape, malloc(info.size_bytes ? info.size_bytes : 1), info.size_bytes};
    }
    return outs;
}

static void free_outputs(TesseraTensorMut *outs) {
    for (size_t o = 0; o < n_out; o++) free(outs[o].data);
    free(outs);
}

static void run_once(TesseraTensorMut *outs) {
    if (tessera_model_run(model, inputs, n_in, outs, n_out) != TESSERA_STATUS_OK) die("run");
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Linear interpolation between order statistics, as `tessera bench` and NumPy compute quantiles. */
static double quantile(const double *sorted, size_t n, double q) {
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)pos, hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - (double)lo);
}

typedef struct {
    pthread_barrier_t *start_line;
    unsigned long runs;
    double end_us;
} Worker;

static void *work(void *arg) {
    Worker *w = arg;
    TesseraTensorMut *outs = new_outputs();
    run_once(outs); /* untimed: the thread's session exists before the clock starts */
    pthread_barrier_wait(w->start_line);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        run_once(outs);
        w->runs++;
    }
    w->end_us = now_us();
    free_outputs(outs);
    return NULL;
}

/* Runs per second from `threads` threads looping for `seconds`. */
static double throughput(int threads, double seconds) {
    pthread_barrier_t start_line;
    pthread_barrier_init(&start_line, NULL, (unsigned)threads + 1);
    Worker workers[8];
    pthread_t ids[8];
    atomic_store(&stop, 0);
    for (int t = 0; t < threads; t++) {
        workers[t] = (Worker){&start_line, 0, 0};
        if (pthread_create(&ids[t], NULL, work, &workers[t]) != 0) {
            fprintf(stderr, "cannot start thread %d\n", t);
            exit(1);
        }
    }
    pthread_barrier_wait(&start_line);
    double start = now_us();
    struct timespec nap = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&nap, NULL);
    atomic_store(&stop, 1);
    unsigned long runs = 0;
    double end = start;
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        runs += workers[t].runs;
        if (workers[t].end_us > end) end = workers[t].end_us;
    }
    pthread_barrier_destroy(&start_line);
    return (double)runs / ((end - start) / 1e6);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL.tsr INDIR ITERS WARMUP SECONDS\n", argv[0]);
        return 2;
    }
    size_t iters = strtoul(argv[3], NULL, 10), warmup = strtoul(argv[4], NULL, 10);
    double seconds = strtod(argv[5], NULL);
    if (iters == 0) {
        fprintf(stderr, "ITERS must be at least 1\n");
        return 2;
    }
    if (tessera_model_load(argv[1], &model) != TESSERA_STATUS_OK) die("load");
    n_in = tessera_model_input_count(model);
    n_out = tessera_model_output_count(model);
    inputs = calloc(n_in ? n_in : 1, sizeof *inputs);
    char path[4096];
    for (size_t i = 0; i < n_in; i++) {
        TesseraTensorInfo info;
        if (tessera_model_input(model, i, &info) != TESSERA_STATUS_OK) die("input");
        snprintf(path, sizeof path, "%s/%zu.bin", argv[2], i);
        inputs[i] = (TesseraTensor){info.name, info.dtype, info.rank, info.shape, read_file(path, info.size_bytes), info.size_bytes};
    }

    TesseraTensorMut *outs = new_outputs();
    for (size_t i = 0; i < warmup; i++) run_once(outs);
    double *us = malloc(iters * sizeof *us);
    for (size_t i = 0; i < iters; i++) {
        double t = now_us();
        run_once(outs);
        us[i] = now_us() - t;
    }
    qsort(us, iters, sizeof *us, by_value);
    printf("{\"api\": \"c\", \"model\": \"%s\", \"iters\": %zu, \"median_us\": %.2f, \"p10_us\": %.2f, \"p90_us\": %.2f",
           tessera_model_name(model), iters, quantile(us, iters, 0.5), quantile(us, iters, 0.1), quantile(us, iters, 0.9));
    const int counts[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) printf(", \"runs_per_s_%d\": %.1f", counts[k], throughput(counts[k], seconds));
    printf("}\n");

    free(us);
    free_outputs(outs);
    for (size_t i = 0; i < n_in; i++) free((void *)inputs[i].data);
    free(inputs);
    tessera_model_free(model);
    return 0;
}
