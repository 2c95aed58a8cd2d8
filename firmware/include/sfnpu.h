/* sfnpu driver: load a DRAM image, run it, read the results, counters and errors.
 *
 * The driver touches the hardware only through the hooks of an sfnpu_platform_t, so the same
 * code runs on a memory-mapped SoC (Zynq, a PCIe BAR), over a serial link, or on a simulation.
 * Register offsets and fields come from the generated sfnpu_regs.h, the image header layout
 * from sfnpu_image.h (both written by `make docs`).
 */
#ifndef SFNPU_H
#define SFNPU_H

#include <stddef.h>
#include <stdint.h>

#include "sfnpu_image.h"
#include "sfnpu_regs.h"
#include "sfnpu_strings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Access to one accelerator instance. Memory addresses are accelerator (DMA) addresses. */
typedef struct {
    void *ctx;
    uint32_t (*csr_read)(void *ctx, uint32_t offset);
    void (*csr_write)(void *ctx, uint32_t offset, uint32_t value);
    /* Return 0 on success. */
    int (*mem_write)(void *ctx, uint64_t addr, const void *data, size_t bytes);
    int (*mem_read)(void *ctx, uint64_t addr, void *data, size_t bytes);
    /* Microseconds from any fixed origin, and a pause between two status polls. */
    uint64_t (*now_us)(void *ctx);
    void (*idle)(void *ctx);
} sfnpu_platform_t;

/* Driver return codes (negative); 0 is success. */
typedef enum {
    SFNPU_OK = 0,
    SFNPU_E_NO_DEVICE = -1,      /* ID register is not the sfnpu magic */
    SFNPU_E_VERSION = -2,        /* register map or image format version differs */
    SFNPU_E_IMAGE = -3,          /* the image is malformed (magic, version, sizes) */
    SFNPU_E_FINGERPRINT = -4,    /* the image was built for another hardware configuration */
    SFNPU_E_MEMORY = -5,         /* a memory hook failed or the image exceeds the window */
    SFNPU_E_BUSY = -6,           /* start while a run is in progress */
    SFNPU_E_TIMEOUT = -7,        /* the run did not finish in time; it was aborted */
    SFNPU_E_HW_ERROR = -8,       /* the accelerator stopped with an error code */
    SFNPU_E_ARGUMENT = -9,       /* a bad argument (null pointer, misaligned base) */
} sfnpu_rc_t;

typedef struct {
    const sfnpu_platform_t *platform;
    uint64_t fingerprint;        /* of the hardware */
    uint32_t group_log_depth;
    uint64_t image_base;         /* of the last loaded image */
    uint32_t image_bytes;        /* its DRAM footprint */
} sfnpu_dev_t;

typedef struct {
#define SFNPU_COUNTER_FIELD_(name) uint64_t name;
    SFNPU_COUNTERS(SFNPU_COUNTER_FIELD_)
#undef SFNPU_COUNTER_FIELD_
} sfnpu_counters_t;

typedef struct {
    uint32_t status;             /* STATUS register at the end */
    uint32_t error_code;         /* sfnpu_error_t */
    uint32_t error_group;
    uint64_t error_addr;
    uint64_t waited_us;          /* from start to done/error (or the timeout) */
} sfnpu_result_t;

/* Check the device (ID, versions) and read its fingerprint and log depth. */
int sfnpu_init(sfnpu_dev_t *dev, const sfnpu_platform_t *platform);

/* Validate an image against the hardware and copy it to memory at `base`; the rest of its
 * footprint (zero-initialised sections) is cleared. */
int sfnpu_load_image(sfnpu_dev_t *dev, const void *image, size_t bytes, uint64_t base);

/* Program IMAGE_BASE (the loaded image's base), the DMA window [window_base, window_limit)
 * and start a run. */
int sfnpu_start(sfnpu_dev_t *dev, uint64_t window_base, uint64_t window_limit);

/* Poll until done or error; after `timeout_us` abort the run (CONTROL.soft_reset) and return
 * SFNPU_E_TIMEOUT. Fills `result`; returns SFNPU_E_HW_ERROR if the hardware reported one. */
int sfnpu_wait(sfnpu_dev_t *dev, uint64_t timeout_us, sfnpu_result_t *result);

int sfnpu_read_counters(sfnpu_dev_t *dev, sfnpu_counters_t *counters);

/* The per-group log of the last run: cycles, DRAM bytes read and written of up to `max` groups
 * (`read_bytes`, `write_bytes` may be NULL); `*count` gets GROUP_COUNT (which may exceed the
 * log depth, in which case only the first GROUP_LOG_DEPTH groups are logged). */
int sfnpu_read_group_log(sfnpu_dev_t *dev, uint32_t *cycles, uint32_t *read_bytes,
                         uint32_t *write_bytes, uint32_t max, uint32_t *count);

/* Copy `bytes` of accelerator memory at `addr` (e.g. the image footprint, an output). */
int sfnpu_read_memory(sfnpu_dev_t *dev, uint64_t addr, void *data, size_t bytes);

/* Find a section of an image in host memory: 0 and `*section` filled, or SFNPU_E_IMAGE. */
int sfnpu_find_section(const void *image, size_t bytes, unsigned kind, unsigned index,
                       sfnpu_image_section_t *section);

const char *sfnpu_error_name(uint32_t error_code);   /* "DMA_WINDOW" */
const char *sfnpu_error_doc(uint32_t error_code);    /* what it means */
const char *sfnpu_rc_string(int rc);                 /* a driver return code */

/* Counter names and values in declaration order, for printing. */
extern const char *const sfnpu_counter_names[SFNPU_COUNTER_COUNT];
void sfnpu_counters_array(const sfnpu_counters_t *counters, uint64_t out[SFNPU_COUNTER_COUNT]);

#ifdef __cplusplus
}
#endif

#endif /* SFNPU_H */
