/* The host program's work, independent of how the accelerator is reached: load an image
 * file, run it, print the outcome (error code decoded, counters, per-group cycles) and write the
 * image's memory footprint after the run to a file. A platform's main() (main_devmem.c, or a
 * simulation) supplies the sfnpu_platform_t. */
#include "sfnpu_run.h"

#include <stdio.h>
#include <stdlib.h>

static int driver_failed(FILE *report, const char *step, int rc)
{
    fprintf(report, "driver %s: %s (%d)\n", step, sfnpu_rc_string(rc), rc);
    return SFNPU_RUN_DRIVER_FAILED;
}

static uint8_t *read_file(const char *path, size_t *bytes)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *data = NULL;
    size_t size = 0, capacity = 0, got;
    do {
        if (size == capacity) {
            capacity = capacity ? 2 * capacity : 1u << 16;
            uint8_t *grown = (uint8_t *)realloc(data, capacity);
            if (!grown) {
                free(data);
                fclose(f);
                return NULL;
            }
            data = grown;
        }
        got = fread(data + size, 1, capacity - size, f);
        size += got;
    } while (got);
    fclose(f);
    *bytes = size;
    return data;
}

int sfnpu_run_file(const sfnpu_platform_t *platform, const sfnpu_run_options_t *options,
                   FILE *report)
{
    sfnpu_dev_t dev;
    sfnpu_result_t result;
    sfnpu_counters_t counters;
    size_t bytes = 0;
    int rc, exit_code = SFNPU_RUN_OK;

    uint8_t *image = read_file(options->image_path, &bytes);
    if (!image) {
        fprintf(report, "cannot read the image %s\n", options->image_path);
        return SFNPU_RUN_DRIVER_FAILED;
    }
    if ((rc = sfnpu_init(&dev, platform)) != SFNPU_OK) {
        free(image);
        return driver_failed(report, "init", rc);
    }
    fprintf(report, "fingerprint 0x%016llx\n", (unsigned long long)dev.fingerprint);
    if ((rc = sfnpu_load_image(&dev, image, bytes, options->base)) != SFNPU_OK) {
        free(image);
        return driver_failed(report, "load", rc);
    }
    free(image);
    if ((rc = sfnpu_start(&dev, options->window_base, options->window_limit)) != SFNPU_OK)
        return driver_failed(report, "start", rc);
    rc = sfnpu_wait(&dev, options->timeout_us, &result);
    fprintf(report, "status 0x%x\nwaited_us %llu\n", result.status,
            (unsigned long long)result.waited_us);
    if (rc == SFNPU_E_TIMEOUT)
        return driver_failed(report, "wait", rc);
    fprintf(report, "error %u %s: %s\n", result.error_code, sfnpu_error_name(result.error_code),
            sfnpu_error_doc(result.error_code));
    if (rc == SFNPU_E_HW_ERROR) {
        fprintf(report, "error_group %u\nerror_addr 0x%llx\n", result.error_group,
                (unsigned long long)result.error_addr);
        exit_code = SFNPU_RUN_HW_ERROR;
    } else if (rc != SFNPU_OK) {
        return driver_failed(report, "wait", rc);
    }

    uint64_t values[SFNPU_COUNTER_COUNT];
    sfnpu_read_counters(&dev, &counters);
    sfnpu_counters_array(&counters, values);
    for (unsigned k = 0; k < SFNPU_COUNTER_COUNT; ++k)
        fprintf(report, "counter %s %llu\n", sfnpu_counter_names[k],
                (unsigned long long)values[k]);

    uint32_t groups = 0, depth = dev.group_log_depth ? dev.group_log_depth : 1;
    uint32_t *log = (uint32_t *)calloc(3u * depth, sizeof *log);   /* cycles, read, written */
    if (!log)
        return driver_failed(report, "group log", SFNPU_E_ARGUMENT);
    sfnpu_read_group_log(&dev, log, log + depth, log + 2u * depth, dev.group_log_depth,
                         &groups);
    fprintf(report, "groups %u\n", groups);
    for (uint32_t k = 0; k < groups && k < dev.group_log_depth; ++k)
        fprintf(report, "group %u %u %u %u\n", k, log[k], log[depth + k], log[2u * depth + k]);
    free(log);

    if (options->dump_path) {
        uint8_t *footprint = (uint8_t *)malloc(dev.image_bytes);
        FILE *out = fopen(options->dump_path, "wb");
        if (!footprint || !out
            || (rc = sfnpu_read_memory(&dev, dev.image_base, footprint, dev.image_bytes))
                != SFNPU_OK
            || fwrite(footprint, 1, dev.image_bytes, out) != dev.image_bytes) {
            free(footprint);
            if (out)
                fclose(out);
            return driver_failed(report, "read back", rc ? rc : SFNPU_E_MEMORY);
        }
        free(footprint);
        fclose(out);
    }
    return exit_code;
}
