/* qemu-insns.c - a qemu-user plugin that counts the guest instructions a
 * program executes, for scripts/arm-insns.sh. Debian's qemu-user (the
 * dynamically linked qemu-aarch64) loads plugins but ships neither the
 * plugin header nor plugins, so the few calls used here are declared from
 * QEMU's documented plugin API (version 1, QEMU 7.2).
 *
 *   gcc -O2 -shared -fPIC scripts/qemu-insns.c -o qemu-insns.so
 *   qemu-aarch64 -plugin ./qemu-insns.so,out=tbs.txt PROGRAM ARGS
 *
 * At exit it prints "qemu-insns: N instructions" to stderr and, with out=,
 * writes one line per translated block: its guest address, its instruction
 * count and how often it ran. Counts are per process, exact for one guest
 * thread (the inline adds are not atomic across threads). */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*udata_cb)(qemu_plugin_id_t, void *);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op, void *,
                                              uint64_t);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, udata_cb, void *);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

struct block {
    uint64_t vaddr, n, runs;
};

static struct block * blocks;
static size_t n_blocks, cap_blocks;
static const char * out_path;

/* Blocks live in chunks that never move: the inline adds hold pointers. */
static struct block * new_block(void) {
    if (n_blocks == cap_blocks) {
        cap_blocks = 1 << 16;
        blocks = calloc(cap_blocks, sizeof *blocks);
        if (!blocks) abort();
        n_blocks = 0;
    }
    return &blocks[n_blocks++];
}

static struct block ** all;
static size_t n_all, cap_all;

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb * tb) {
    (void)id;
    struct block * b = new_block();
    b->vaddr = qemu_plugin_tb_vaddr(tb);
    b->n = qemu_plugin_tb_n_insns(tb);
    if (n_all == cap_all) {
        cap_all = cap_all ? 2 * cap_all : 1 << 16;
        all = realloc(all, cap_all * sizeof *all);
        if (!all) abort();
    }
    all[n_all++] = b;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->runs, 1);
}

static void finished(qemu_plugin_id_t id, void * p) {
    (void)id;
    (void)p;
    uint64_t total = 0;
    FILE * f = out_path ? fopen(out_path, "w") : NULL;
    for (size_t i = 0; i < n_all; i++) {
        total += all[i]->n * all[i]->runs;
        if (f && all[i]->runs)
            fprintf(f, "%llx %llu %llu\n", (unsigned long long)all[i]->vaddr,
                    (unsigned long long)all[i]->n, (unsigned long long)all[i]->runs);
    }
    if (f) fclose(f);
    fprintf(stderr, "qemu-insns: %llu instructions\n", (unsigned long long)total);
}

__attribute__((visibility("default"))) int
qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t * info, int argc, char ** argv) {
    (void)info;
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "out=", 4) == 0) out_path = argv[i] + 4;
    qemu_plugin_register_vcpu_tb_trans_cb(id, translated);
    qemu_plugin_register_atexit_cb(id, finished, NULL);
    return 0;
}
