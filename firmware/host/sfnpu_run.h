/* The host program's platform-independent part (see sfnpu_run.c). */
#ifndef SFNPU_RUN_H
#define SFNPU_RUN_H

#include <stdio.h>

#include "sfnpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *image_path;      /* DRAM image written by `sfnpu compile` */
    const char *dump_path;       /* where to write the footprint after the run, or NULL */
    uint64_t base;               /* image base in accelerator memory */
    uint64_t window_base;        /* DMA window */
    uint64_t window_limit;
    uint64_t timeout_us;
} sfnpu_run_options_t;

/* Exit codes of the host program. */
enum { SFNPU_RUN_OK = 0, SFNPU_RUN_HW_ERROR = 1, SFNPU_RUN_DRIVER_FAILED = 2 };

/* Run one image and print a report of `key value` lines; returns an exit code above. */
int sfnpu_run_file(const sfnpu_platform_t *platform, const sfnpu_run_options_t *options,
                   FILE *report);

#ifdef __cplusplus
}
#endif

#endif /* SFNPU_RUN_H */
