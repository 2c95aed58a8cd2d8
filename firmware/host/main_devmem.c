/* Host program for Linux on a memory-mapped accelerator (Zynq PS, or a PCIe BAR exposed as a
 * file): the registers and the accelerator's memory are mapped with mmap().
 *
 *   sfnpu-run IMAGE DUMP CSR_FILE CSR_OFFSET MEM_FILE MEM_OFFSET MEM_DMA_BASE MEM_BYTES [TIMEOUT_MS]
 *
 * e.g. on a Zynq: sfnpu-run image.bin out.bin /dev/mem 0x43c00000 /dev/mem 0x10000000 \
 *                 0x10000000 0x04000000
 * MEM_DMA_BASE is the address the accelerator uses for the first byte of the mapping.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "sfnpu_run.h"

typedef struct {
    volatile uint32_t *csr;
    volatile uint8_t *mem;
    uint64_t dma_base, bytes;
} devmem_t;

static uint32_t csr_read(void *ctx, uint32_t offset)
{
    return ((devmem_t *)ctx)->csr[offset / 4u];
}

static void csr_write(void *ctx, uint32_t offset, uint32_t value)
{
    ((devmem_t *)ctx)->csr[offset / 4u] = value;
}

static int mem_access(devmem_t *d, uint64_t addr, size_t bytes)
{
    return addr >= d->dma_base && addr - d->dma_base + bytes <= d->bytes;
}

static int mem_write(void *ctx, uint64_t addr, const void *data, size_t bytes)
{
    devmem_t *d = (devmem_t *)ctx;
    if (!mem_access(d, addr, bytes))
        return -1;
    for (size_t k = 0; k < bytes; ++k)
        d->mem[addr - d->dma_base + k] = ((const uint8_t *)data)[k];
    __sync_synchronize();
    return 0;
}

static int mem_read(void *ctx, uint64_t addr, void *data, size_t bytes)
{
    devmem_t *d = (devmem_t *)ctx;
    if (!mem_access(d, addr, bytes))
        return -1;
    __sync_synchronize();
    for (size_t k = 0; k < bytes; ++k)
        ((uint8_t *)data)[k] = d->mem[addr - d->dma_base + k];
    return 0;
}

static uint64_t now_us(void *ctx)
{
    struct timespec t;
    (void)ctx;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

static void idle(void *ctx)
{
    struct timespec pause = {0, 100000};
    (void)ctx;
    nanosleep(&pause, NULL);
}

static void *map(const char *path, uint64_t offset, uint64_t bytes)
{
    int fd = open(path, O_RDWR | O_SYNC);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

int main(int argc, char **argv)
{
    if (argc < 9 || argc > 10) {
        fprintf(stderr, "usage: %s IMAGE DUMP CSR_FILE CSR_OFFSET MEM_FILE MEM_OFFSET "
                        "MEM_DMA_BASE MEM_BYTES [TIMEOUT_MS]\n", argv[0]);
        return SFNPU_RUN_DRIVER_FAILED;
    }
    devmem_t d;
    d.dma_base = strtoull(argv[7], NULL, 0);
    d.bytes = strtoull(argv[8], NULL, 0);
    d.csr = (volatile uint32_t *)map(argv[3], strtoull(argv[4], NULL, 0), 4096);
    d.mem = (volatile uint8_t *)map(argv[5], strtoull(argv[6], NULL, 0), d.bytes);
    if (!d.csr || !d.mem) {
        fprintf(stderr, "cannot map the registers or the memory\n");
        return SFNPU_RUN_DRIVER_FAILED;
    }
    sfnpu_platform_t platform = {&d, csr_read, csr_write, mem_write, mem_read, now_us, idle};
    sfnpu_run_options_t options = {
        argv[1], argv[2], d.dma_base, d.dma_base, d.dma_base + d.bytes,
        (argc == 10 ? strtoull(argv[9], NULL, 0) : 10000u) * 1000u,
    };
    return sfnpu_run_file(&platform, &options, stdout);
}
