// simple.c - the shortest complete program that embeds smol: load a model,
// tokenize a prompt, decode it as one batch, then greedily generate tokens
// and print them as they come. Plain C, to show the API needs nothing else.
//
//   simple models/SmolLM2-135M-Instruct.Q4_1.gguf "The capital of France is" [n]

#include "smol.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Every smol call that can fail returns a status and leaves a message.
static bool ok(smol_status status, const char * what) {
    if (status != SMOL_OK) fprintf(stderr, "simple: %s failed: %s\n", what, smol_last_error());
    return status == SMOL_OK;
}

int main(int argc, char ** argv) {
    if (argc < 3 || argv[2][0] == '\0') { // a non-empty text always gives a token
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [N_PREDICT]\n", argv[0]);
        return 2;
    }
    const int n_predict = argc > 3 ? atoi(argv[3]) : 32;
    int rc = 1;
    smol_model * model = NULL;
    smol_context * ctx = NULL;
    smol_sampler * sampler = NULL;
    smol_batch batch = {0};

    // No token is shorter than one byte, so the prompt's length (plus a bos)
    // bounds its token count.
    const size_t len = strlen(argv[2]);
    smol_token * tokens = malloc((len + 2) * sizeof(smol_token));
    int32_t n_prompt = 0;
    smol_model_params mparams = smol_model_default_params();
    if (!ok(smol_model_load(argv[1], &mparams, &model), "load")) goto done;
    if (!ok(smol_tokenize(model, argv[2], len, true, false, tokens, (int32_t)len + 2, &n_prompt),
            "tokenize"))
        goto done;

    smol_context_params cparams = smol_context_default_params();
    cparams.n_ctx = (uint32_t)(n_prompt + n_predict);
    cparams.n_batch = (uint32_t)n_prompt;
    if (!ok(smol_context_create(model, &cparams, &ctx), "create context")) goto done;
    smol_sampler_params sparams = smol_sampler_default_params();
    sparams.temperature = 0.0f; // greedy: the same prompt always gives the same text
    if (!ok(smol_sampler_create(&sparams, &sampler), "create sampler")) goto done;
    smol_model_info info;
    smol_model_get_info(model, &info);

    // Only the last prompt token's logits are needed to pick the next token.
    batch = smol_batch_init(n_prompt);
    for (int32_t i = 0; i < n_prompt; i++)
        smol_batch_add(&batch, n_prompt, tokens[i], i, 0, i == n_prompt - 1);
    fputs(argv[2], stdout);
    for (int32_t pos = n_prompt; pos < n_prompt + n_predict; pos++) {
        if (!ok(smol_decode(ctx, &batch), "decode")) goto done;
        smol_token next = smol_sampler_sample(sampler, smol_get_logits(ctx, -1), info.n_vocab);
        smol_sampler_accept(sampler, next);
        if (smol_token_is_eog(model, next)) break;
        char piece[256];
        size_t n_piece = 0;
        if (!ok(smol_token_to_piece(model, next, false, piece, sizeof piece, &n_piece), "piece"))
            goto done;
        fwrite(piece, 1, n_piece, stdout); // a piece may be part of a UTF-8 character
        fflush(stdout);
        batch.n_tokens = 0; // the next batch is the one new token
        smol_batch_add(&batch, n_prompt, next, pos, 0, true);
    }
    putchar('\n');
    rc = 0;

done:
    smol_batch_free(&batch);
    smol_sampler_free(sampler);
    smol_context_free(ctx);
    smol_model_free(model);
    free(tokens);
    return rc;
}
