/* sfnpu driver (see sfnpu.h). Plain C99, no allocation, no OS. */
#include "sfnpu.h"

#include <string.h>

#define REG_READ(dev, reg) ((dev)->platform->csr_read((dev)->platform->ctx, (reg)))
#define REG_WRITE(dev, reg, value) \
    ((dev)->platform->csr_write((dev)->platform->ctx, (reg), (value)))

/* Bytes cleared per memory write when zeroing a footprint. */
#define ZERO_CHUNK 256u
/* Status polls an aborted run gets to finish its bus transactions. */
#define ABORT_POLLS 10000u

static uint64_t read64(sfnpu_dev_t *dev, uint32_t lo_offset)
{
    uint64_t lo = REG_READ(dev, lo_offset);     /* latches HI of a counter */
    uint64_t hi = REG_READ(dev, lo_offset + 4u);
    return lo | hi << 32;
}

static void write64(sfnpu_dev_t *dev, uint32_t lo_offset, uint64_t value)
{
    REG_WRITE(dev, lo_offset, (uint32_t)value);
    REG_WRITE(dev, lo_offset + 4u, (uint32_t)(value >> 32));
}

int sfnpu_init(sfnpu_dev_t *dev, const sfnpu_platform_t *platform)
{
    if (!dev || !platform || !platform->csr_read || !platform->csr_write)
        return SFNPU_E_ARGUMENT;
    memset(dev, 0, sizeof *dev);
    dev->platform = platform;
    if (REG_READ(dev, SFNPU_REG_ID) != SFNPU_ID_MAGIC)
        return SFNPU_E_NO_DEVICE;
    uint32_t version = REG_READ(dev, SFNPU_REG_VERSION);
    if ((version & SFNPU_VERSION_REGMAP_MASK) >> SFNPU_VERSION_REGMAP_SHIFT
            != SFNPU_REGMAP_VERSION
        || (version & SFNPU_VERSION_IMAGE_FORMAT_MASK) >> SFNPU_VERSION_IMAGE_FORMAT_SHIFT
            != SFNPU_IMAGE_VERSION)
        return SFNPU_E_VERSION;
    dev->fingerprint = read64(dev, SFNPU_REG_FINGERPRINT_LO);
    dev->group_log_depth = REG_READ(dev, SFNPU_REG_GROUP_LOG_DEPTH);
    return SFNPU_OK;
}

int sfnpu_load_image(sfnpu_dev_t *dev, const void *image, size_t bytes, uint64_t base)
{
    const sfnpu_image_header_t *header = (const sfnpu_image_header_t *)image;
    sfnpu_image_header_t h;
    if (!dev || !dev->platform || !image || !dev->platform->mem_write)
        return SFNPU_E_ARGUMENT;
    if (base % SFNPU_IMAGE_SECTION_ALIGN)
        return SFNPU_E_ARGUMENT;
    if (bytes < sizeof h)
        return SFNPU_E_IMAGE;
    memcpy(&h, header, sizeof h);
    if (memcmp(h.magic, SFNPU_IMAGE_MAGIC, sizeof h.magic) != 0)
        return SFNPU_E_IMAGE;
    if (h.version != SFNPU_IMAGE_VERSION)
        return SFNPU_E_VERSION;
    if (h.header_bytes > bytes || h.image_bytes < bytes
        || h.header_bytes < sizeof h + (uint64_t)h.section_count * sizeof(sfnpu_image_section_t))
        return SFNPU_E_IMAGE;
    if (h.fingerprint != dev->fingerprint)
        return SFNPU_E_FINGERPRINT;
    if (dev->platform->mem_write(dev->platform->ctx, base, image, bytes) != 0)
        return SFNPU_E_MEMORY;
    static const uint8_t zeros[ZERO_CHUNK];
    for (uint64_t off = bytes; off < h.image_bytes; off += ZERO_CHUNK) {
        uint64_t n = h.image_bytes - off < ZERO_CHUNK ? h.image_bytes - off : ZERO_CHUNK;
        if (dev->platform->mem_write(dev->platform->ctx, base + off, zeros, (size_t)n) != 0)
            return SFNPU_E_MEMORY;
    }
    dev->image_base = base;
    dev->image_bytes = h.image_bytes;
    return SFNPU_OK;
}

int sfnpu_start(sfnpu_dev_t *dev, uint64_t window_base, uint64_t window_limit)
{
    if (!dev || !dev->platform || !dev->image_bytes)
        return SFNPU_E_ARGUMENT;
    if (dev->image_base < window_base || dev->image_base + dev->image_bytes > window_limit)
        return SFNPU_E_MEMORY;
    if (REG_READ(dev, SFNPU_REG_STATUS) & SFNPU_STATUS_BUSY_MASK)
        return SFNPU_E_BUSY;
    write64(dev, SFNPU_REG_IMAGE_BASE_LO, dev->image_base);
    write64(dev, SFNPU_REG_DMA_WINDOW_BASE_LO, window_base);
    write64(dev, SFNPU_REG_DMA_WINDOW_LIMIT_LO, window_limit);
    REG_WRITE(dev, SFNPU_REG_CONTROL, SFNPU_CONTROL_START_MASK);
    return SFNPU_OK;
}

int sfnpu_wait(sfnpu_dev_t *dev, uint64_t timeout_us, sfnpu_result_t *result)
{
    if (!dev || !dev->platform || !dev->platform->now_us || !result)
        return SFNPU_E_ARGUMENT;
    const sfnpu_platform_t *p = dev->platform;
    const uint32_t finished = SFNPU_STATUS_DONE_MASK | SFNPU_STATUS_ERROR_MASK;
    uint64_t started = p->now_us(p->ctx);
    int timed_out = 0;
    uint32_t status;
    for (;;) {
        status = REG_READ(dev, SFNPU_REG_STATUS);
        if (status & finished)
            break;
        if (p->now_us(p->ctx) - started >= timeout_us) {
            timed_out = 1;
            break;
        }
        if (p->idle)
            p->idle(p->ctx);
    }
    memset(result, 0, sizeof *result);
    result->waited_us = p->now_us(p->ctx) - started;
    if (timed_out) {
        /* Abort, and let the core finish its bus transactions, so it is idle again before
         * anyone reuses its memory. */
        REG_WRITE(dev, SFNPU_REG_CONTROL, SFNPU_CONTROL_SOFT_RESET_MASK);
        for (unsigned k = 0; k < ABORT_POLLS; ++k) {
            result->status = REG_READ(dev, SFNPU_REG_STATUS);
            if (!(result->status & SFNPU_STATUS_BUSY_MASK))
                break;
            if (p->idle)
                p->idle(p->ctx);
        }
        return SFNPU_E_TIMEOUT;
    }
    result->status = status;
    result->error_code = REG_READ(dev, SFNPU_REG_ERROR_CODE) & SFNPU_ERROR_CODE_CODE_MASK;
    result->error_group = REG_READ(dev, SFNPU_REG_ERROR_GROUP);
    result->error_addr = read64(dev, SFNPU_REG_ERROR_ADDR_LO);
    return (status & SFNPU_STATUS_ERROR_MASK) ? SFNPU_E_HW_ERROR : SFNPU_OK;
}

int sfnpu_read_counters(sfnpu_dev_t *dev, sfnpu_counters_t *counters)
{
    if (!dev || !dev->platform || !counters)
        return SFNPU_E_ARGUMENT;
#define SFNPU_READ_COUNTER_(name) counters->name = read64(dev, SFNPU_REG_##name##_LO);
    SFNPU_COUNTERS(SFNPU_READ_COUNTER_)
#undef SFNPU_READ_COUNTER_
    return SFNPU_OK;
}

int sfnpu_read_group_log(sfnpu_dev_t *dev, uint32_t *cycles, uint32_t *read_bytes,
                         uint32_t *write_bytes, uint32_t max, uint32_t *count)
{
    if (!dev || !dev->platform || !count || (max && !cycles))
        return SFNPU_E_ARGUMENT;
    uint32_t groups = REG_READ(dev, SFNPU_REG_GROUP_COUNT);
    uint32_t logged = groups < dev->group_log_depth ? groups : dev->group_log_depth;
    *count = groups;
    /* GROUP_LOG_DATA reads advance GROUP_LOG_INDEX: read the byte counts first. */
    REG_WRITE(dev, SFNPU_REG_GROUP_LOG_INDEX, 0);
    for (uint32_t k = 0; k < logged && k < max; ++k) {
        if (read_bytes)
            read_bytes[k] = REG_READ(dev, SFNPU_REG_GROUP_LOG_READ_BYTES);
        if (write_bytes)
            write_bytes[k] = REG_READ(dev, SFNPU_REG_GROUP_LOG_WRITE_BYTES);
        cycles[k] = REG_READ(dev, SFNPU_REG_GROUP_LOG_DATA);
    }
    return SFNPU_OK;
}

int sfnpu_read_memory(sfnpu_dev_t *dev, uint64_t addr, void *data, size_t bytes)
{
    if (!dev || !dev->platform || !dev->platform->mem_read || (bytes && !data))
        return SFNPU_E_ARGUMENT;
    return dev->platform->mem_read(dev->platform->ctx, addr, data, bytes) ? SFNPU_E_MEMORY
                                                                          : SFNPU_OK;
}

int sfnpu_find_section(const void *image, size_t bytes, unsigned kind, unsigned index,
                       sfnpu_image_section_t *section)
{
    const uint8_t *base = (const uint8_t *)image;
    sfnpu_image_header_t h;
    if (!image || !section || bytes < sizeof h)
        return SFNPU_E_ARGUMENT;
    memcpy(&h, base, sizeof h);
    if (sizeof h + (uint64_t)h.section_count * sizeof *section > bytes)
        return SFNPU_E_IMAGE;
    for (uint32_t k = 0; k < h.section_count; ++k) {
        memcpy(section, base + sizeof h + k * sizeof *section, sizeof *section);
        if (section->kind == kind && section->index == index)
            return SFNPU_OK;
    }
    return SFNPU_E_IMAGE;
}

#define SFNPU_ERROR_NAME_(name, doc) [SFNPU_ERROR_##name] = #name,
#define SFNPU_ERROR_DOC_(name, doc) [SFNPU_ERROR_##name] = doc,
static const char *const error_names[] = { SFNPU_ERRORS(SFNPU_ERROR_NAME_) };
static const char *const error_docs[] = { SFNPU_ERRORS(SFNPU_ERROR_DOC_) };
#undef SFNPU_ERROR_NAME_
#undef SFNPU_ERROR_DOC_

const char *sfnpu_error_name(uint32_t error_code)
{
    if (error_code < sizeof error_names / sizeof *error_names && error_names[error_code])
        return error_names[error_code];
    return "UNKNOWN";
}

const char *sfnpu_error_doc(uint32_t error_code)
{
    if (error_code < sizeof error_docs / sizeof *error_docs && error_docs[error_code])
        return error_docs[error_code];
    return "an error code this driver does not know (newer hardware?)";
}

const char *sfnpu_rc_string(int rc)
{
    switch (rc) {
    case SFNPU_OK: return "success";
    case SFNPU_E_NO_DEVICE: return "no sfnpu at this address (ID register mismatch)";
    case SFNPU_E_VERSION: return "register map or image format version differs from the driver";
    case SFNPU_E_IMAGE: return "malformed image (magic, header or section table)";
    case SFNPU_E_FINGERPRINT: return "image built for another hardware configuration";
    case SFNPU_E_MEMORY: return "memory access failed or outside the DMA window";
    case SFNPU_E_BUSY: return "the accelerator is busy";
    case SFNPU_E_TIMEOUT: return "timeout: the run was aborted";
    case SFNPU_E_HW_ERROR: return "the accelerator stopped with an error";
    case SFNPU_E_ARGUMENT: return "bad argument";
    default: return "unknown driver return code";
    }
}

#define SFNPU_COUNTER_NAME_(name) #name,
const char *const sfnpu_counter_names[SFNPU_COUNTER_COUNT] = { SFNPU_COUNTERS(SFNPU_COUNTER_NAME_) };
#undef SFNPU_COUNTER_NAME_

void sfnpu_counters_array(const sfnpu_counters_t *counters, uint64_t out[SFNPU_COUNTER_COUNT])
{
    unsigned k = 0;
#define SFNPU_COUNTER_VALUE_(name) out[k++] = counters->name;
    SFNPU_COUNTERS(SFNPU_COUNTER_VALUE_)
#undef SFNPU_COUNTER_VALUE_
}
