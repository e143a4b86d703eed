/* Links against an installed smol and calls into it: the version, the CPU
 * kernels, and the error a missing model gets. */
#include <smol.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    smol_model * model = NULL;
    smol_status st = smol_model_load("/nonexistent.gguf", NULL, &model);
    printf("smol %s, kernels %s, missing model: %s\n", smol_version(), smol_cpu_kernels_name(),
           smol_status_name(st));
    return st == SMOL_ERR_IO && model == NULL && strlen(smol_last_error()) > 0 ? 0 : 1;
}
