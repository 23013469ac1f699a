/*
 * refimpl_dump_example.c — tools/refimpl_dump.h in a whole (small) llama.cpp program: decode the token ids given
 * on the command line in one llama_decode, with every position an output, dumping the intermediates to DIR.
 *
 *   cc -O2 -I tools -I $LLAMA_INCLUDE tools/refimpl_dump_example.c -L $LLAMA_LIB -lllama -lggml -lggml-base \
 *      -Wl,-rpath,$LLAMA_LIB -o refimpl_dump_example
 *   ./refimpl_dump_example MODEL.gguf DIR 1063,258,342,391
 *   refimpl trace MODEL.gguf --tokens 1063,258,342,391 --against DIR --emulate=ggml
 *
 * ($LLAMA_INCLUDE: llama.h and ggml's headers — llama-cpp-python installs them in site-packages/include;
 * $LLAMA_LIB: libllama.so and libggml*.so, e.g. site-packages/llama_cpp/lib.) tests/test_trace_against.py
 * compiles it as C and as C++ and checks its dump equals refimpl.oracle.dumper's, bit for bit.
 * llama.cpp's defaults otherwise (F16 K/V, flash attention auto, n_ubatch 512): what --emulate=ggml emulates.
 */
#include "llama.h"
#include "refimpl_dump.h"

static struct refimpl_dump dump;

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf DIR TOKEN,TOKEN,...\n", argv[0]);
        return 2;
    }
    llama_token tokens[512];
    int n = 0;
    for (char * s = argv[3]; *s && n < 512; n++) {
        tokens[n] = (llama_token) strtol(s, &s, 10);
        if (*s == ',') {
            s++;
        }
    }
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (model == NULL) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    refimpl_dump_init(&dump, argv[2]);
    struct llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 512;
    cparams.n_threads = cparams.n_threads_batch = 4;
    cparams.cb_eval = refimpl_dump_cb_eval;
    cparams.cb_eval_user_data = &dump;
    struct llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == NULL) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1; /* every position an output: the last layer and result_* hold every row */
    }
    batch.n_tokens = n;
    refimpl_dump_tokens(&dump, n);
    int rc = llama_decode(ctx, batch);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    refimpl_dump_free(&dump);
    llama_backend_free();
    return rc == 0 ? 0 : 1;
}
