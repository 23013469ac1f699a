/*
 * refimpl_dump.h — dump a llama.cpp-based engine's intermediates for `refimpl trace --against DIR`.
 *
 * A single header, C99 or C++, needing nothing but ggml's own headers (ggml.h, ggml-backend.h). It is a
 * ggml_backend_sched_eval_callback (llama_context_params.cb_eval): llama.cpp hands it every graph tensor,
 * first with ask = true (it answers whether it wants the values), then with ask = false once computed.
 * It writes DIR/NAME.npy — float32 [positions, values per position], the token axis outermost as in the
 * graph — appending one row per token of each decode, for the tensors named as refimpl names them
 * (llama.cpp's cb names: "attn_norm-0", "linear_attn_out-3", "result_output"; REFIMPL_DUMP_NAMES below,
 * the same list as refimpl/oracle/dumper.py LAYER_NAMES and MODEL_NAMES).
 *
 *     #include "refimpl_dump.h"
 *     static struct refimpl_dump dump;                // ~400 KB: static or on the heap
 *     refimpl_dump_init(&dump, "dump");               // the directory must exist
 *     cparams.cb_eval = refimpl_dump_cb_eval;
 *     cparams.cb_eval_user_data = &dump;
 *     ...
 *     refimpl_dump_tokens(&dump, batch.n_tokens);     // before each llama_decode: the tokens it computes
 *     llama_decode(ctx, batch);
 *
 * then `refimpl trace MODEL --tokens ... --against dump` (with --batch N if the engine decoded N at a time).
 * Every token of a decode must be an output (batch.logits[i] = 1) for the last layer and result_* to hold all
 * positions, and a decode must fit one ubatch (n_tokens <= n_ubatch), as then each tensor holds n_tokens rows.
 * A name computed twice in one graph (Kcur-3: before and after RoPE) keeps its last value, as llama.cpp's
 * eval callback sees it. F32 and F16 tensors are written (F16 converted); others are skipped. Tensors on a
 * GPU are copied to the host first (ggml_backend_tensor_get), so a CUDA or Metal engine dumps the same way.
 * Errors (a file that cannot be written) are printed to stderr once per name; the graph goes on.
 */
#ifndef REFIMPL_DUMP_H
#define REFIMPL_DUMP_H

#include "ggml.h"
#include "ggml-backend.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef REFIMPL_DUMP_MAX_FILES
#define REFIMPL_DUMP_MAX_FILES 4096
#endif

/* llama.cpp's cb names (without "-IL") of the intermediates refimpl compares, then the model-level ones. */
static const char * const REFIMPL_DUMP_NAMES[] = {
    "attn_norm",
    "Qcur_full", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "attn_pregate", "attn_gated", "attn_output",
    "linear_attn_qkv_mixed", "linear_attn_mixed_qkvz", "qkv_mixed", "z", "linear_attn_mixed_ba", "beta_sigmoid", "gate",
    "conv_output_raw", "conv_output_silu", "final_output", "linear_attn_out",
    "attn_residual", "attn_post_norm",
    "ffn_moe_logits", "ffn_moe_weights_norm", "ffn_moe_swiglu", "ffn_moe_out", "ffn_swiglu", "ffn_shexp",
    "shared_expert_gate_sigmoid", "ffn_out", "l_out",
    NULL,
};
static const char * const REFIMPL_DUMP_MODEL_NAMES[] = {
    "model.input_embed", "model.embed_tokens", "result_norm", "result_output", NULL,
};

struct refimpl_dump_file {
    char    name[GGML_MAX_NAME];
    int64_t row;          /* values per position */
    int64_t rows;         /* positions written */
    int64_t call;         /* the decode that last wrote it */
    int64_t rows_before;  /* positions written before that decode */
    bool    failed;
};

struct refimpl_dump {
    char    dir[1024];
    int64_t n_tokens;     /* tokens of the decode being computed (refimpl_dump_tokens) */
    int64_t call;
    int     n_files;
    struct refimpl_dump_file files[REFIMPL_DUMP_MAX_FILES];
    float * buf;
    size_t  buf_size;
    unsigned char * raw;
    size_t  raw_size;
};

static inline void refimpl_dump_init(struct refimpl_dump * d, const char * dir) {
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "%s", dir);
}

/* Call before each llama_decode with the number of tokens it computes. */
static inline void refimpl_dump_tokens(struct refimpl_dump * d, int64_t n_tokens) {
    d->n_tokens = n_tokens;
    d->call += 1;
}

static inline void refimpl_dump_free(struct refimpl_dump * d) {
    free(d->buf);
    free(d->raw);
    d->buf = NULL;
    d->raw = NULL;
    d->buf_size = d->raw_size = 0;
}

/* "NAME-IL" with NAME in REFIMPL_DUMP_NAMES and IL digits, or a model-level name. */
static inline bool refimpl_dump_wanted(const char * name) {
    const char * dash = strrchr(name, '-');
    for (int i = 0; REFIMPL_DUMP_MODEL_NAMES[i]; i++) {
        if (strcmp(name, REFIMPL_DUMP_MODEL_NAMES[i]) == 0) {
            return true;
        }
    }
    if (dash == NULL || dash[1] == '\0') {
        return false;
    }
    for (const char * p = dash + 1; *p; p++) {
        if (*p < '0' || *p > '9') {
            return false;
        }
    }
    for (int i = 0; REFIMPL_DUMP_NAMES[i]; i++) {
        size_t n = strlen(REFIMPL_DUMP_NAMES[i]);
        if ((size_t) (dash - name) == n && strncmp(name, REFIMPL_DUMP_NAMES[i], n) == 0) {
            return true;
        }
    }
    return false;
}

#define REFIMPL_DUMP_HEADER 128 /* magic, version, length, the dict padded with spaces to 128 bytes */

/* The .npy v1.0 header of float32 [rows, row]; the row count in a fixed-width field, rewritten in place. */
static inline void refimpl_dump_header(char * h, int64_t rows, int64_t row) {
    char dict[REFIMPL_DUMP_HEADER];
    int  n = snprintf(dict, sizeof(dict), "{'descr': '<f4', 'fortran_order': False, 'shape': (%20lld, %lld), }",
                      (long long) rows, (long long) row);
    memcpy(h, "\x93NUMPY\x01\x00", 8);
    h[8] = (char) ((REFIMPL_DUMP_HEADER - 10) & 0xff);
    h[9] = (char) ((REFIMPL_DUMP_HEADER - 10) >> 8);
    memset(h + 10, ' ', REFIMPL_DUMP_HEADER - 10);
    memcpy(h + 10, dict, (size_t) n);
    h[REFIMPL_DUMP_HEADER - 1] = '\n';
}

static inline struct refimpl_dump_file * refimpl_dump_file_of(struct refimpl_dump * d, const char * name) {
    for (int i = 0; i < d->n_files; i++) {
        if (strcmp(d->files[i].name, name) == 0) {
            return &d->files[i];
        }
    }
    if (d->n_files == REFIMPL_DUMP_MAX_FILES) {
        return NULL;
    }
    struct refimpl_dump_file * f = &d->files[d->n_files++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", name);
    f->call = -1;
    return f;
}

/* The tensor's values in index order (i0 fastest), as float, into d->buf; false for a type not dumped. */
static inline bool refimpl_dump_values(struct refimpl_dump * d, const struct ggml_tensor * t) {
    const int64_t n = ggml_nelements(t);
    const unsigned char * data = (const unsigned char *) t->data;
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) {
        return false;
    }
    if (t->buffer != NULL && !ggml_backend_buffer_is_host(t->buffer)) { /* a GPU tensor: copy it to the host */
        size_t nbytes = ggml_nbytes(t);
        if (d->raw_size < nbytes) {
            free(d->raw);
            d->raw = (unsigned char *) malloc(nbytes);
            d->raw_size = d->raw ? nbytes : 0;
            if (!d->raw) {
                return false;
            }
        }
        ggml_backend_tensor_get(t, d->raw, 0, nbytes);
        data = d->raw;
    }
    if (d->buf_size < (size_t) n) {
        free(d->buf);
        d->buf = (float *) malloc((size_t) n * sizeof(float));
        d->buf_size = d->buf ? (size_t) n : 0;
        if (!d->buf) {
            return false;
        }
    }
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    const unsigned char * p = data + i3 * t->nb[3] + i2 * t->nb[2] + i1 * t->nb[1] + i0 * t->nb[0];
                    if (t->type == GGML_TYPE_F32) {
                        memcpy(&d->buf[k++], p, sizeof(float));
                    } else {
                        ggml_fp16_t h;
                        memcpy(&h, p, sizeof(h));
                        d->buf[k++] = ggml_fp16_to_fp32(h);
                    }
                }
            }
        }
    }
    return true;
}

static inline void refimpl_dump_write(struct refimpl_dump * d, struct refimpl_dump_file * f, int64_t row) {
    char path[1200];
    char header[REFIMPL_DUMP_HEADER];
    snprintf(path, sizeof(path), "%s/%s.npy", d->dir, f->name);
    if (f->call != d->call) { /* the first time in this decode: append after what is there */
        f->rows_before = f->rows;
        f->call = d->call;
    }
    if (f->rows_before > 0 && f->row != row) {
        if (!f->failed) {
            fprintf(stderr, "refimpl_dump: %s has %lld values per position now, %lld before; skipped\n", f->name,
                    (long long) row, (long long) f->row);
        }
        f->failed = true;
        return;
    }
    FILE * fp = fopen(path, f->rows_before > 0 ? "r+b" : "wb");
    if (fp == NULL) {
        if (!f->failed) {
            fprintf(stderr, "refimpl_dump: cannot write %s\n", path);
        }
        f->failed = true;
        return;
    }
    f->row = row;
    f->rows = f->rows_before + d->n_tokens;
    refimpl_dump_header(header, f->rows, row);
    bool ok = fwrite(header, 1, sizeof(header), fp) == sizeof(header);
    ok = ok && fseek(fp, (long) (REFIMPL_DUMP_HEADER + f->rows_before * row * (int64_t) sizeof(float)), SEEK_SET) == 0;
    ok = ok && fwrite(d->buf, sizeof(float), (size_t) (row * d->n_tokens), fp) == (size_t) (row * d->n_tokens);
    ok = (fclose(fp) == 0) && ok;
    if (!ok && !f->failed) {
        fprintf(stderr, "refimpl_dump: error writing %s\n", path);
        f->failed = true;
    }
}

/* The ggml_backend_sched_eval_callback: user_data is the struct refimpl_dump. */
static inline bool refimpl_dump_cb_eval(struct ggml_tensor * t, bool ask, void * user_data) {
    struct refimpl_dump * d = (struct refimpl_dump *) user_data;
    if (ask) {
        return refimpl_dump_wanted(t->name);
    }
    if (!refimpl_dump_wanted(t->name) || d->n_tokens <= 0) {
        return true;
    }
    const int64_t n = ggml_nelements(t);
    int64_t outer = 1; /* the token axis is the outermost one of a per-token tensor ([n_embd, T], [head, n_head, T]) */
    for (int k = GGML_MAX_DIMS - 1; k >= 1; k--) {
        if (t->ne[k] > 1) {
            outer = t->ne[k];
            break;
        }
    }
    if (n % d->n_tokens != 0 || (d->n_tokens > 1 && outer != d->n_tokens)) {
        return true; /* not a per-token tensor, or a ubatch smaller than the decode (n_tokens > n_ubatch) */
    }
    struct refimpl_dump_file * f = refimpl_dump_file_of(d, t->name);
    if (f != NULL && !f->failed && refimpl_dump_values(d, t)) {
        refimpl_dump_write(d, f, n / d->n_tokens);
    }
    return true;
}

#endif /* REFIMPL_DUMP_H */
