/* Runs a tessera artifact through the C API.
 *
 *   run MODEL.tsr INDIR OUTDIR
 *
 * Prints how the artifact was built (its provenance, as JSON) and the model's inputs and outputs, reads
 * input i's raw little-endian bytes from INDIR/i.bin, runs the model, and writes output o's bytes to
 * OUTDIR/o.bin. Then shows two errors the API reports instead of crashing: a run missing its inputs, and a
 * file that is not there.
 *
 * Build (see runtime-c/tests/c_program.rs, which does this):
 *   cc run.c -I runtime-c/include -L target/release -ltessera_runtime_c -Wl,-rpath,target/release -o run
 *   cc run.c -I runtime-c/include target/release/libtessera_runtime_c.a -lpthread -ldl -lm -lrt -lgcc_s -lutil -lc -o run
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera.h"

static int fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, tessera_last_error());
    return 1;
}

/* Reads exactly `size` bytes of `path` into a new buffer; NULL (with a message) otherwise. */
static void *read_file(const char *path, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    void *buf = malloc(size ? size : 1);
    size_t got = fread(buf, 1, size, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != size || extra) {
        fprintf(stderr, "%s: expected %zu bytes\n", path, size);
        free(buf);
        return NULL;
    }
    return buf;
}

static void print_info(const char *kind, const TesseraTensorInfo *t) {
    printf("  %s %s %s[", kind, t->name, tessera_dtype_name(t->dtype));
    for (size_t d = 0; d < t->rank; d++) printf(d ? "x%zu" : "%zu", t->shape[d]);
    printf("] (%zu bytes)\n", t->size_bytes);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.tsr INDIR OUTDIR\n", argv[0]);
        return 2;
    }
    TesseraModel *model = NULL;
    if (tessera_model_load(argv[1], &model) != TESSERA_STATUS_OK) return fail("load");
    printf("tessera %s, model %s\n", tessera_version(), tessera_model_name(model));
    const char *provenance = tessera_model_provenance_json(model);
    printf("provenance %s\n", provenance ? provenance : "(not recorded)");

    size_t n_in = tessera_model_input_count(model), n_out = tessera_model_output_count(model);
    TesseraTensor *inputs = calloc(n_in, sizeof *inputs);
    TesseraTensorMut *outputs = calloc(n_out, sizeof *outputs);
    char path[4096];
    for (size_t i = 0; i < n_in; i++) {
        TesseraTensorInfo info;
        if (tessera_model_input(model, i, &info) != TESSERA_STATUS_OK) return fail("input");
        print_info("input ", &info);
        snprintf(path, sizeof path, "%s/%zu.bin", argv[2], i);
        void *data = read_file(path, info.size_bytes);
        if (!data) return 1;
        inputs[i] = (TesseraTensor){info.name, info.dtype, info.rank, info.shape, data, info.size_bytes};
    }
    for (size_t o = 0; o < n_out; o++) {
        TesseraTensorInfo info;
        if (tessera_model_output(model, o, &info) != TESSERA_STATUS_OK) return fail("output");
        print_info("output", &info);
        outputs[o] = (TesseraTensorMut){info.name, info.dtype, info.rank, info.shape, malloc(info.size_bytes ? info.size_bytes : 1), info.size_bytes};
    }

    if (tessera_model_run(model, inputs, n_in, outputs, n_out) != TESSERA_STATUS_OK) return fail("run");
    for (size_t o = 0; o < n_out; o++) {
        snprintf(path, sizeof path, "%s/%zu.bin", argv[3], o);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(outputs[o].data, 1, outputs[o].size_bytes, f) != outputs[o].size_bytes) {
            fprintf(stderr, "cannot write %s\n", path);
            return 1;
        }
        fclose(f);
        printf("wrote %s\n", path);
    }

    /* Errors are statuses and messages, never crashes. */
    TesseraStatus s = tessera_model_run(model, inputs, 0, outputs, n_out);
    printf("run without inputs: status %d: %s\n", (int)s, tessera_last_error());
    TesseraModel *missing = NULL;
    s = tessera_model_load("no/such/model.tsr", &missing);
    printf("load of a missing file: status %d: %s\n", (int)s, tessera_last_error());

    for (size_t i = 0; i < n_in; i++) free((void *)inputs[i].data);
    for (size_t o = 0; o < n_out; o++) free(outputs[o].data);
    free(inputs);
    free(outputs);
    tessera_model_free(model);
    return 0;
}
