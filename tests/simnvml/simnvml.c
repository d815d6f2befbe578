/*
 * simnvml.c - a simulated NVML library (libnvidia-ml.so.1) for testing without a GPU.
 *
 * Built against the real nvml.h, so every exported function has the driver's exact signature
 * and struct layout; the real Python bindings (nvidia-ml-py) load it like the driver's library.
 *
 * What the GPUs report comes from a scenario file named by the environment variable
 * GPUPROF_SIMNVML_SCENARIO, read when the library is first initialised (refcount 0 -> 1).
 * The format is line based; see tests/simnvml/__init__.py for the writer. In short:
 *
 *   simnvml 1                                  header (optional)
 *   driver_version 550.54.15                   also nvml_version STR, cuda_driver_version INT
 *   origin 1700000000.25                       unix time of scenario t=0 (default: nvmlInit)
 *   sample_period_us 166667                    period of the nvmlDeviceGetSamples ring buffer
 *   sample_buffer 100                          entries kept in that ring buffer
 *   init_error driver_not_loaded               make every nvmlInit* fail with that error
 *   gpus 2                                     number of GPUs (before any per-GPU line)
 *   gpu 0 name NVIDIA H100 80GB HBM3           also uuid, pci_bus_id, mem_total_bytes,
 *                                              mem_reserved_bytes, gpm 0|1, nvlink_links N,
 *                                              pcie_counters 0|1, pcie_counter_wrap BYTES,
 *                                              pcie_link_gen N, pcie_link_width N,
 *                                              lost_at_s T
 *   series 0 util_gpu_pct 0:50 2.5:100         piecewise constant (time_s:value), last value held;
 *                                              repeated lines for one metric append points
 *   proc 0 1234 compute 1073741824 35 0 inf    gpu pid compute|graphics mem_bytes sm_util% start end
 *   fault nvmlDeviceGetPowerUsage not_supported 1    function error gpu-index|*
 *   fault field:197 invalid_argument 0         the same for one field of nvmlDeviceGetFieldValues:
 *                                              that entry's nvmlReturn, the call still succeeds
 *   latency nvmlDeviceGetPcieThroughput 20000  extra microseconds every call of that function takes
 *
 * Besides the NVML API the library exports simnvml_calls(name): how many times an NVML
 * function was called since nvmlInit, so tests can check what a collector retries.
 *
 * Blank lines and lines starting with '#' are ignored. Without a "gpus" line there is no GPU.
 * A series' first value also holds before its first point; a metric without a series reports
 * a plain idle value (see METRICS below).
 *
 * Units are NVML's: PCIe KB/s, NVLink KiB/s (integrated here into the cumulative KiB counters
 * NVML's throughput fields report), power mW, clocks MHz, temperature C, percentages 0-100.
 * The PCIe series also feed the cumulative byte counter fields NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES
 * (KB = 1024 bytes, as nvmlDeviceGetPcieThroughput counts); "pcie_counters 0" makes those fields
 * NOT_SUPPORTED on a GPU, as on drivers that predate them, and "pcie_counter_wrap N" makes them
 * wrap modulo N bytes.
 *
 * nvmlDeviceGetSamples behaves like the driver's ring buffer: sample k of period P averages
 * its metric over ((k-1)P, kP]; the buffer is full from the start, as the driver's is long
 * before a profiler attaches. Its timestamps are CLOCK_MONOTONIC microseconds, deliberately
 * not the Unix epoch: drivers do not promise a clock domain, so callers must only compare them
 * with each other. Field values carry Unix-epoch microseconds, as nvml.h documents.
 *
 * A function can be left out of a build, as on an old driver, by renaming it at compile time:
 * -DnvmlGpmSampleGet=simnvml_omitted_nvmlGpmSampleGet. The header's declaration is renamed
 * the same way, so the build stays consistent and the NVML name is simply not exported.
 */

#define _POSIX_C_SOURCE 200809L
/* Use the exact exported names (nvmlInit_v2, nvmlDeviceGetCount_v2...) rather than the header's
 * macros that map the unversioned names onto them. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------ */
/* Scenario model                                                                             */
/* ------------------------------------------------------------------------------------------ */

enum metric {
    M_UTIL_GPU,
    M_UTIL_MEM,
    M_MEM_USED,
    M_PCIE_TX,
    M_PCIE_RX,
    M_NVLINK_TX,
    M_NVLINK_RX,
    M_POWER,
    M_SM_CLOCK,
    M_TEMP,
    M_REASONS,
    M_SM_ACTIVE,
    M_SM_OCCUPANCY,
    M_TENSOR_ACTIVE,
    M_DRAM_ACTIVE,
    M_COUNT
};

/* Scenario names of the metrics and the value a GPU reports when the scenario gives none. */
static const struct {
    const char *name;
    double fallback;
} METRICS[M_COUNT] = {
    [M_UTIL_GPU] = {"util_gpu_pct", 0.0},
    [M_UTIL_MEM] = {"util_mem_pct", 0.0},
    [M_MEM_USED] = {"mem_used_bytes", 0.0},
    [M_PCIE_TX] = {"pcie_tx_kb_s", 0.0},
    [M_PCIE_RX] = {"pcie_rx_kb_s", 0.0},
    [M_NVLINK_TX] = {"nvlink_tx_kib_s", 0.0},
    [M_NVLINK_RX] = {"nvlink_rx_kib_s", 0.0},
    [M_POWER] = {"power_mw", 60000.0},
    [M_SM_CLOCK] = {"sm_clock_mhz", 1410.0},
    [M_TEMP] = {"temp_c", 35.0},
    [M_REASONS] = {"clock_event_reasons", 0.0},
    [M_SM_ACTIVE] = {"sm_active_pct", 0.0},
    [M_SM_OCCUPANCY] = {"sm_occupancy_pct", 0.0},
    [M_TENSOR_ACTIVE] = {"tensor_active_pct", 0.0},
    [M_DRAM_ACTIVE] = {"dram_active_pct", 0.0},
};

typedef struct {
    double t; /* seconds of scenario time */
    double v;
} point_t;

typedef struct {
    size_t n, cap;
    point_t *pts; /* sorted by t */
} series_t;

typedef struct {
    unsigned int pid;
    int graphics; /* 0: compute process, 1: graphics process */
    unsigned long long mem_bytes;
    unsigned int sm_util;
    double start, end; /* alive while start <= t < end */
} proc_t;

/* nvml.h only forward-declares the device struct: a handle is a pointer to one of these. */
struct nvmlDevice_st {
    unsigned int index;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned long long mem_total, mem_reserved;
    int gpm;
    unsigned int nvlink_links;
    unsigned int pcie_link_gen, pcie_link_width; /* the link's maximum, as the system allows */
    int pcie_counters;                      /* the PCIe byte counter fields are supported */
    unsigned long long pcie_counter_wrap;   /* those counters wrap modulo this; 0: never */
    double lost_at; /* scenario time the GPU falls off the bus; INFINITY if never */
    series_t series[M_COUNT];
    proc_t *procs;
    size_t n_procs;
};

/* A GPM sample only needs to remember when and where it was taken: the metrics between two
 * samples are the time averages of the scenario series over that interval. */
#define GPM_SAMPLE_MAGIC 0x67706d73u
struct nvmlGpmSample_st {
    unsigned int magic;
    nvmlDevice_t dev; /* NULL until filled by nvmlGpmSampleGet */
    double t;
};

typedef struct {
    char func[96];
    nvmlReturn_t code;
    int gpu; /* -1: every GPU and the system-level calls */
} fault_t;

typedef struct {
    char func[96];
    long us;
} latency_t;

static struct {
    int refcount;
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    int has_origin;
    double origin;
    long long period_us;
    long long buffer;
    nvmlReturn_t init_error;
    unsigned int n_gpus;
    struct nvmlDevice_st *gpus;
    fault_t *faults;
    size_t n_faults;
    latency_t *latencies;
    size_t n_latencies;
    long long base_mono_us; /* CLOCK_MONOTONIC microseconds at scenario time 0 */
    double t_init;          /* scenario time of nvmlInit */
} sim;

/* ------------------------------------------------------------------------------------------ */
/* Time                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static long long clock_us(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* Scenario time now, in seconds. Everything after nvmlInit runs on CLOCK_MONOTONIC so that
 * ring-buffer timestamps stay exact and wall-clock steps cannot reorder samples. */
static double sim_now(void)
{
    return (double)(clock_us(CLOCK_MONOTONIC) - sim.base_mono_us) / 1e6;
}

/* Floor division that rounds towards minus infinity for negative numerators too. */
static long long floor_div(long long a, long long b)
{
    long long q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* ------------------------------------------------------------------------------------------ */
/* Series                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int series_append(series_t *s, double t, double v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        point_t *pts = realloc(s->pts, cap * sizeof *pts);
        if (!pts)
            return -1;
        s->pts = pts;
        s->cap = cap;
    }
    if (s->n && t <= s->pts[s->n - 1].t)
        return -1; /* times must increase */
    s->pts[s->n].t = t;
    s->pts[s->n].v = v;
    s->n++;
    return 0;
}

/* Index of the last point at or before t, or -1 when t is before the first point. */
static long series_find(const series_t *s, double t)
{
    long lo = 0, hi = (long)s->n - 1, found = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (s->pts[mid].t <= t) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

/* Value of a metric at scenario time t: the first value holds before the first point. */
static double value_at(nvmlDevice_t dev, enum metric m, double t)
{
    const series_t *s = &dev->series[m];
    if (s->n == 0)
        return METRICS[m].fallback;
    long i = series_find(s, t);
    return s->pts[i < 0 ? 0 : i].v;
}

/* Integral of a metric over [a, b] (value x seconds). */
static double integrate(nvmlDevice_t dev, enum metric m, double a, double b)
{
    const series_t *s = &dev->series[m];
    if (b <= a)
        return 0.0;
    if (s->n == 0)
        return METRICS[m].fallback * (b - a);
    double total = 0.0;
    long i = series_find(s, a);
    for (; i < (long)s->n; i++) {
        double seg_start = i < 0 ? -INFINITY : s->pts[i].t;
        double seg_end = i + 1 < (long)s->n ? s->pts[i + 1].t : INFINITY;
        double lo = a > seg_start ? a : seg_start;
        double hi = b < seg_end ? b : seg_end;
        if (hi > lo)
            total += s->pts[i < 0 ? 0 : i].v * (hi - lo);
        if (seg_end >= b)
            break;
    }
    return total;
}

/* Average of a metric over [a, b]. */
static double average(nvmlDevice_t dev, enum metric m, double a, double b)
{
    return b > a ? integrate(dev, m, a, b) / (b - a) : value_at(dev, m, b);
}

static unsigned int to_uint(double v)
{
    if (v <= 0.0)
        return 0;
    if (v >= (double)UINT_MAX)
        return UINT_MAX;
    return (unsigned int)llround(v);
}

/* ------------------------------------------------------------------------------------------ */
/* Error names                                                                                */
/* ------------------------------------------------------------------------------------------ */

static const struct {
    nvmlReturn_t code;
    const char *name;    /* scenario spelling */
    const char *message; /* nvmlErrorString */
} ERRORS[] = {
    {NVML_SUCCESS, "success", "Success"},
    {NVML_ERROR_UNINITIALIZED, "uninitialized", "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "invalid_argument", "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "not_supported", "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "no_permission", "Insufficient Permissions"},
    {NVML_ERROR_NOT_FOUND, "not_found", "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "insufficient_size", "Insufficient Size"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded", "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "timeout", "Timeout"},
    {NVML_ERROR_IRQ_ISSUE, "irq_issue", "Interrupt Request Issue"},
    {NVML_ERROR_GPU_IS_LOST, "gpu_is_lost", "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "reset_required", "GPU requires restart"},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "lib_rm_version_mismatch",
     "RM has detected an NVML/RM version mismatch."},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "argument_version_mismatch",
     "Argument version mismatch"},
    {NVML_ERROR_NO_DATA, "no_data", "No data"},
    {NVML_ERROR_UNKNOWN, "unknown", "Unknown Error"},
};

static int parse_error(const char *name, nvmlReturn_t *code)
{
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        if (strcmp(ERRORS[i].name, name) == 0) {
            *code = ERRORS[i].code;
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Scenario file                                                                              */
/* ------------------------------------------------------------------------------------------ */

static void scenario_free(void)
{
    for (unsigned int g = 0; g < sim.n_gpus; g++) {
        for (int m = 0; m < M_COUNT; m++)
            free(sim.gpus[g].series[m].pts);
        free(sim.gpus[g].procs);
    }
    free(sim.gpus);
    free(sim.faults);
    free(sim.latencies);
    memset(&sim, 0, sizeof sim);
}

static void scenario_defaults(void)
{
    snprintf(sim.driver_version, sizeof sim.driver_version, "%s", "550.54.15");
    snprintf(sim.nvml_version, sizeof sim.nvml_version, "%s", "12.550.54.15");
    sim.cuda_driver_version = 12040;
    sim.period_us = 166667; /* the driver's 1/6 s utilisation sample period */
    sim.buffer = 100;
    sim.init_error = NVML_SUCCESS;
}

static int set_gpu_count(unsigned int n)
{
    if (sim.gpus)
        return -1; /* only once */
    sim.gpus = calloc(n ? n : 1, sizeof *sim.gpus);
    if (!sim.gpus)
        return -1;
    sim.n_gpus = n;
    for (unsigned int g = 0; g < n; g++) {
        struct nvmlDevice_st *d = &sim.gpus[g];
        d->index = g;
        snprintf(d->name, sizeof d->name, "%s", "NVIDIA H100 80GB HBM3");
        snprintf(d->uuid, sizeof d->uuid, "GPU-00000000-0000-0000-0000-%012x", g);
        snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "00000000:%02X:00.0", 0x18 + g);
        d->mem_total = 85899345920ULL;
        d->nvlink_links = 18;
        d->pcie_link_gen = 5;
        d->pcie_link_width = 16;
        d->pcie_counters = 1;
        d->lost_at = INFINITY;
    }
    return 0;
}

/* Splits off the next space-separated token; NULL at the end of the line. */
static char *next_token(char **cursor)
{
    char *p = *cursor;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0')
        return NULL;
    char *start = p;
    while (*p && *p != ' ' && *p != '\t')
        p++;
    if (*p)
        *p++ = '\0';
    *cursor = p;
    return start;
}

/* The rest of the line with surrounding blanks removed (for names containing spaces). */
static char *rest_of_line(char **cursor)
{
    char *p = *cursor;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        p[--n] = '\0';
    *cursor = p + n;
    return p;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    if (!s)
        return -1;
    *out = strtod(s, &end); /* accepts "inf" */
    return (end == s || *end) ? -1 : 0;
}

static int parse_ull(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || *s == '-')
        return -1;
    *out = strtoull(s, &end, 10);
    return (end == s || *end) ? -1 : 0;
}

static int parse_metric(const char *name)
{
    for (int m = 0; m < M_COUNT; m++)
        if (name && strcmp(METRICS[m].name, name) == 0)
            return m;
    return -1;
}

static struct nvmlDevice_st *parse_gpu(const char *s)
{
    unsigned long long g;
    if (parse_ull(s, &g) != 0 || g >= sim.n_gpus)
        return NULL;
    return &sim.gpus[g];
}

/* "gpu I KEY VALUE" */
static int parse_gpu_line(char *cursor)
{
    struct nvmlDevice_st *d = parse_gpu(next_token(&cursor));
    const char *key = next_token(&cursor);
    unsigned long long u;
    double x;
    if (!d || !key)
        return -1;
    if (strcmp(key, "name") == 0) {
        snprintf(d->name, sizeof d->name, "%s", rest_of_line(&cursor));
        return 0;
    }
    const char *value = next_token(&cursor);
    if (!value)
        return -1;
    if (strcmp(key, "uuid") == 0)
        snprintf(d->uuid, sizeof d->uuid, "%s", value);
    else if (strcmp(key, "pci_bus_id") == 0)
        snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "%s", value);
    else if (strcmp(key, "mem_total_bytes") == 0 && parse_ull(value, &u) == 0)
        d->mem_total = u;
    else if (strcmp(key, "mem_reserved_bytes") == 0 && parse_ull(value, &u) == 0)
        d->mem_reserved = u;
    else if (strcmp(key, "gpm") == 0 && parse_ull(value, &u) == 0)
        d->gpm = u != 0;
    else if (strcmp(key, "nvlink_links") == 0 && parse_ull(value, &u) == 0)
        d->nvlink_links = (unsigned int)u;
    else if (strcmp(key, "pcie_link_gen") == 0 && parse_ull(value, &u) == 0)
        d->pcie_link_gen = (unsigned int)u;
    else if (strcmp(key, "pcie_link_width") == 0 && parse_ull(value, &u) == 0)
        d->pcie_link_width = (unsigned int)u;
    else if (strcmp(key, "pcie_counters") == 0 && parse_ull(value, &u) == 0)
        d->pcie_counters = u != 0;
    else if (strcmp(key, "pcie_counter_wrap") == 0 && parse_ull(value, &u) == 0)
        d->pcie_counter_wrap = u;
    else if (strcmp(key, "lost_at_s") == 0 && parse_double(value, &x) == 0)
        d->lost_at = x;
    else
        return -1;
    return 0;
}

/* "series I METRIC t:v t:v ..." */
static int parse_series_line(char *cursor)
{
    struct nvmlDevice_st *d = parse_gpu(next_token(&cursor));
    int m = parse_metric(next_token(&cursor));
    char *tok;
    if (!d || m < 0)
        return -1;
    while ((tok = next_token(&cursor)) != NULL) {
        char *colon = strchr(tok, ':');
        double t, v;
        if (!colon)
            return -1;
        *colon = '\0';
        if (parse_double(tok, &t) != 0 || parse_double(colon + 1, &v) != 0)
            return -1;
        if (series_append(&d->series[m], t, v) != 0)
            return -1;
    }
    return 0;
}

/* "proc I PID compute|graphics MEM_BYTES SM_UTIL START END" */
static int parse_proc_line(char *cursor)
{
    struct nvmlDevice_st *d = parse_gpu(next_token(&cursor));
    const char *pid = next_token(&cursor), *kind = next_token(&cursor);
    const char *mem = next_token(&cursor), *sm = next_token(&cursor);
    const char *start = next_token(&cursor), *end = next_token(&cursor);
    proc_t p;
    unsigned long long u;
    if (!d || !kind)
        return -1;
    if (parse_ull(pid, &u) != 0 || u > UINT_MAX)
        return -1;
    p.pid = (unsigned int)u;
    if (strcmp(kind, "compute") == 0)
        p.graphics = 0;
    else if (strcmp(kind, "graphics") == 0)
        p.graphics = 1;
    else
        return -1;
    if (parse_ull(mem, &p.mem_bytes) != 0 || parse_ull(sm, &u) != 0 || u > 100)
        return -1;
    p.sm_util = (unsigned int)u;
    if (parse_double(start, &p.start) != 0 || parse_double(end, &p.end) != 0)
        return -1;
    proc_t *procs = realloc(d->procs, (d->n_procs + 1) * sizeof *procs);
    if (!procs)
        return -1;
    d->procs = procs;
    d->procs[d->n_procs++] = p;
    return 0;
}

/* "fault FUNCTION ERROR GPU|*" */
static int parse_fault_line(char *cursor)
{
    const char *func = next_token(&cursor), *err = next_token(&cursor);
    const char *gpu = next_token(&cursor);
    fault_t f;
    unsigned long long g;
    if (!func || !err || !gpu || strlen(func) >= sizeof f.func)
        return -1;
    snprintf(f.func, sizeof f.func, "%s", func);
    if (parse_error(err, &f.code) != 0)
        return -1;
    if (strcmp(gpu, "*") == 0)
        f.gpu = -1;
    else if (parse_ull(gpu, &g) == 0 && g < INT_MAX)
        f.gpu = (int)g;
    else
        return -1;
    fault_t *faults = realloc(sim.faults, (sim.n_faults + 1) * sizeof *faults);
    if (!faults)
        return -1;
    sim.faults = faults;
    sim.faults[sim.n_faults++] = f;
    return 0;
}

/* "latency FUNCTION MICROSECONDS" */
static int parse_latency_line(char *cursor)
{
    const char *func = next_token(&cursor);
    unsigned long long us;
    latency_t l;
    if (!func || strlen(func) >= sizeof l.func || parse_ull(next_token(&cursor), &us) != 0)
        return -1;
    snprintf(l.func, sizeof l.func, "%s", func);
    l.us = (long)us;
    latency_t *lat = realloc(sim.latencies, (sim.n_latencies + 1) * sizeof *lat);
    if (!lat)
        return -1;
    sim.latencies = lat;
    sim.latencies[sim.n_latencies++] = l;
    return 0;
}

static int parse_line(char *line)
{
    char *cursor = line;
    const char *key = next_token(&cursor);
    unsigned long long u;
    if (!key || key[0] == '#')
        return 0;
    if (strcmp(key, "simnvml") == 0)
        return parse_ull(next_token(&cursor), &u) == 0 && u == 1 ? 0 : -1;
    if (strcmp(key, "driver_version") == 0) {
        snprintf(sim.driver_version, sizeof sim.driver_version, "%s", rest_of_line(&cursor));
        return 0;
    }
    if (strcmp(key, "nvml_version") == 0) {
        snprintf(sim.nvml_version, sizeof sim.nvml_version, "%s", rest_of_line(&cursor));
        return 0;
    }
    if (strcmp(key, "cuda_driver_version") == 0) {
        if (parse_ull(next_token(&cursor), &u) != 0 || u > INT_MAX)
            return -1;
        sim.cuda_driver_version = (int)u;
        return 0;
    }
    if (strcmp(key, "origin") == 0) {
        sim.has_origin = 1;
        return parse_double(next_token(&cursor), &sim.origin);
    }
    if (strcmp(key, "sample_period_us") == 0) {
        if (parse_ull(next_token(&cursor), &u) != 0 || u == 0)
            return -1;
        sim.period_us = (long long)u;
        return 0;
    }
    if (strcmp(key, "sample_buffer") == 0) {
        if (parse_ull(next_token(&cursor), &u) != 0 || u == 0 || u > 100000)
            return -1;
        sim.buffer = (long long)u;
        return 0;
    }
    if (strcmp(key, "init_error") == 0)
        return parse_error(next_token(&cursor), &sim.init_error);
    if (strcmp(key, "gpus") == 0) {
        if (parse_ull(next_token(&cursor), &u) != 0 || u > 1024)
            return -1;
        return set_gpu_count((unsigned int)u);
    }
    if (strcmp(key, "gpu") == 0)
        return parse_gpu_line(cursor);
    if (strcmp(key, "series") == 0)
        return parse_series_line(cursor);
    if (strcmp(key, "proc") == 0)
        return parse_proc_line(cursor);
    if (strcmp(key, "fault") == 0)
        return parse_fault_line(cursor);
    if (strcmp(key, "latency") == 0)
        return parse_latency_line(cursor);
    return -1;
}

/* Reads the scenario; on failure says why on stderr, since a test author needs the line. */
static nvmlReturn_t scenario_load(void)
{
    const char *path = getenv("GPUPROF_SIMNVML_SCENARIO");
    scenario_free();
    scenario_defaults();
    if (!path || !*path) {
        fprintf(stderr, "simnvml: GPUPROF_SIMNVML_SCENARIO is not set\n");
        return NVML_ERROR_UNKNOWN;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "simnvml: cannot open scenario %s\n", path);
        return NVML_ERROR_UNKNOWN;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    nvmlReturn_t ret = NVML_SUCCESS;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (parse_line(line) != 0) {
            fprintf(stderr, "simnvml: %s:%ld: cannot parse: %s\n", path, lineno, line);
            ret = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    free(line);
    fclose(f);
    if (ret == NVML_SUCCESS && !sim.gpus)
        ret = set_gpu_count(0) == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    if (ret != NVML_SUCCESS)
        scenario_free();
    return ret;
}

/* ------------------------------------------------------------------------------------------ */
/* Common entry checks                                                                        */
/* ------------------------------------------------------------------------------------------ */

static int valid_device(nvmlDevice_t dev)
{
    return dev && sim.gpus && dev >= sim.gpus && dev < sim.gpus + sim.n_gpus;
}

static void apply_latency(const char *func)
{
    for (size_t i = 0; i < sim.n_latencies; i++) {
        if (strcmp(sim.latencies[i].func, func) == 0 && sim.latencies[i].us > 0) {
            struct timespec ts = {sim.latencies[i].us / 1000000L,
                                  (sim.latencies[i].us % 1000000L) * 1000L};
            nanosleep(&ts, NULL);
        }
    }
}

static nvmlReturn_t injected_fault(const char *func, int gpu)
{
    for (size_t i = 0; i < sim.n_faults; i++) {
        const fault_t *f = &sim.faults[i];
        if ((f->gpu < 0 || f->gpu == gpu) && strcmp(f->func, func) == 0)
            return f->code;
    }
    return NVML_SUCCESS;
}

/* Calls per exported function since nvmlInit, for tests that check a collector does not
 * retry what it was told is unsupported. Keyed by __func__, whose storage is static. */
#define MAX_COUNTED 96
static struct {
    const char *func;
    long calls;
} call_counts[MAX_COUNTED];

static void count_call(const char *func)
{
    for (int i = 0; i < MAX_COUNTED; i++) {
        if (!call_counts[i].func)
            call_counts[i].func = func;
        if (call_counts[i].func == func || strcmp(call_counts[i].func, func) == 0) {
            call_counts[i].calls++;
            return;
        }
    }
}

/* Not an NVML function: how often `func` was called since the last nvmlInit (refcount 0->1). */
long simnvml_calls(const char *func)
{
    for (int i = 0; i < MAX_COUNTED && call_counts[i].func; i++)
        if (func && strcmp(call_counts[i].func, func) == 0)
            return call_counts[i].calls;
    return 0;
}

/* Checks every call makes, in the driver's order: initialised, valid handle, GPU still on the
 * bus, then any fault the scenario injects for this function. dev may be NULL. */
static nvmlReturn_t enter(const char *func, nvmlDevice_t dev)
{
    if (sim.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    count_call(func);
    apply_latency(func);
    if (dev) {
        if (!valid_device(dev))
            return NVML_ERROR_INVALID_ARGUMENT;
        if (sim_now() >= dev->lost_at)
            return NVML_ERROR_GPU_IS_LOST;
    }
    return injected_fault(func, dev ? (int)dev->index : -1);
}

#define ENTER(dev)                                                                                 \
    do {                                                                                           \
        nvmlReturn_t entry_ret_ = enter(__func__, (dev));                                          \
        if (entry_ret_ != NVML_SUCCESS)                                                            \
            return entry_ret_;                                                                     \
    } while (0)

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Init, shutdown, errors, system                                                             */
/* ------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    if (sim.refcount > 0) {
        sim.refcount++;
        return NVML_SUCCESS;
    }
    memset(call_counts, 0, sizeof call_counts);
    nvmlReturn_t ret = scenario_load();
    if (ret != NVML_SUCCESS)
        return ret;
    if (sim.init_error != NVML_SUCCESS) {
        ret = sim.init_error;
        scenario_free();
        return ret;
    }
    long long mono = clock_us(CLOCK_MONOTONIC);
    sim.t_init = 0.0;
    if (sim.has_origin)
        sim.t_init = (double)clock_us(CLOCK_REALTIME) / 1e6 - sim.origin;
    sim.base_mono_us = mono - llround(sim.t_init * 1e6);
    sim.refcount = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void)
{
    if (sim.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (--sim.refcount == 0)
        scenario_free();
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == result)
            return ERRORS[i].message;
    return "Unknown Error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    ENTER(NULL);
    return copy_string(version, length, sim.driver_version);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    ENTER(NULL);
    return copy_string(version, length, sim.nvml_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    ENTER(NULL);
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = sim.cuda_driver_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    ENTER(NULL);
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = sim.cuda_driver_version;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Device discovery and identity                                                              */
/* ------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    ENTER(NULL);
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = sim.n_gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    ENTER(NULL);
    if (!device || index >= sim.n_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* A GPU that fell off the bus cannot be opened any more. */
    if (sim_now() >= sim.gpus[index].lost_at)
        return NVML_ERROR_GPU_IS_LOST;
    nvmlReturn_t ret = injected_fault(__func__, (int)index);
    if (ret != NVML_SUCCESS)
        return ret;
    *device = &sim.gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    ENTER(NULL);
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int g = 0; g < sim.n_gpus; g++) {
        if (strcmp(sim.gpus[g].uuid, uuid) == 0) {
            if (sim_now() >= sim.gpus[g].lost_at)
                return NVML_ERROR_GPU_IS_LOST;
            *device = &sim.gpus[g];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    ENTER(device);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    ENTER(device);
    return copy_string(name, length, device->name);
}

/* The link's generation and width: maximum and current are the same here (a real idle GPU
 * may train its link down; gpuprof reads the maximum). */
static nvmlReturn_t link_value(unsigned int *out, unsigned int value)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    ENTER(device);
    return link_value(gen, device->pcie_link_gen);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    ENTER(device);
    return link_value(width, device->pcie_link_width);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    ENTER(device);
    return link_value(gen, device->pcie_link_gen);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    ENTER(device);
    return link_value(width, device->pcie_link_width);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    ENTER(device);
    return copy_string(uuid, length, device->uuid);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    ENTER(device);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int domain = 0, bus = 0, dev = 0, function = 0;
    memset(pci, 0, sizeof *pci);
    sscanf(device->pci_bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010DE; /* device 0x2330 (H100 SXM), vendor 0x10DE */
    pci->pciSubSystemId = 0x16C110DE;
    snprintf(pci->busId, sizeof pci->busId, "%s", device->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xFFFF,
             bus & 0xFF, dev & 0x1F, function & 0x7);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Memory, utilisation, throughput, power, clocks, temperature                                */
/* ------------------------------------------------------------------------------------------ */

static unsigned long long mem_used(nvmlDevice_t device)
{
    double used = value_at(device, M_MEM_USED, sim_now());
    unsigned long long cap = device->mem_total - device->mem_reserved;
    if (used <= 0.0)
        return 0;
    return used >= (double)cap ? cap : (unsigned long long)used;
}

/* v1 counts the driver's reserved memory as used; v2 reports it separately. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    ENTER(device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->mem_total;
    memory->used = mem_used(device) + device->mem_reserved;
    memory->free = device->mem_total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    ENTER(device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->mem_total;
    memory->reserved = device->mem_reserved;
    memory->used = mem_used(device);
    memory->free = device->mem_total - device->mem_reserved - memory->used;
    return NVML_SUCCESS;
}

/* The ring buffer holds the samples k*P (P = sample period) up to now; sample k averages its
 * metric over ((k-1)P, kP] and is stamped base_mono_us + k*P microseconds. */
static long long newest_sample(void)
{
    return floor_div(clock_us(CLOCK_MONOTONIC) - sim.base_mono_us, sim.period_us);
}

static unsigned long long sample_stamp(long long k)
{
    long long ts = sim.base_mono_us + k * sim.period_us;
    return ts > 0 ? (unsigned long long)ts : 0;
}

static double sample_value(nvmlDevice_t device, enum metric m, long long k)
{
    double p = (double)sim.period_us / 1e6;
    return average(device, m, (double)(k - 1) * p, (double)k * p);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    ENTER(device);
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    long long k = newest_sample();
    utilization->gpu = to_uint(sample_value(device, M_UTIL_GPU, k));
    utilization->memory = to_uint(sample_value(device, M_UTIL_MEM, k));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                  unsigned long long lastSeenTimeStamp,
                                  nvmlValueType_t *sampleValType, unsigned int *sampleCount,
                                  nvmlSample_t *samples)
{
    ENTER(device);
    if (!sampleValType || !sampleCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    enum metric m;
    int averaged = 1;
    switch (type) {
    case NVML_GPU_UTILIZATION_SAMPLES:
        m = M_UTIL_GPU;
        break;
    case NVML_MEMORY_UTILIZATION_SAMPLES:
        m = M_UTIL_MEM;
        break;
    case NVML_TOTAL_POWER_SAMPLES:
        m = M_POWER;
        averaged = 0;
        break;
    case NVML_PROCESSOR_CLK_SAMPLES:
        m = M_SM_CLOCK;
        averaged = 0;
        break;
    default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
    long long newest = newest_sample();
    long long oldest = newest - sim.buffer + 1;
    while (oldest <= newest && sample_stamp(oldest) == 0)
        oldest++;
    if (oldest > newest)
        return NVML_ERROR_NOT_FOUND;
    *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (!samples) {
        /* Size query: what the buffer holds, which may be more than the next call returns. */
        *sampleCount = (unsigned int)(newest - oldest + 1);
        return NVML_SUCCESS;
    }
    if (*sampleCount == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    long long first = oldest;
    if (lastSeenTimeStamp >= sample_stamp(newest))
        return NVML_ERROR_NOT_FOUND;
    if (lastSeenTimeStamp >= sample_stamp(oldest)) {
        long long after = floor_div((long long)lastSeenTimeStamp - sim.base_mono_us,
                                    sim.period_us) + 1;
        if (after > first)
            first = after;
    }
    unsigned int n = 0;
    double p = (double)sim.period_us / 1e6;
    for (long long k = first; k <= newest && n < *sampleCount; k++, n++) {
        double v = averaged ? sample_value(device, m, k) : value_at(device, m, (double)k * p);
        samples[n].timeStamp = sample_stamp(k);
        samples[n].sampleValue.uiVal = to_uint(v);
    }
    *sampleCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                         unsigned int *value)
{
    ENTER(device);
    if (!value)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (counter) {
    case NVML_PCIE_UTIL_TX_BYTES:
        *value = to_uint(value_at(device, M_PCIE_TX, sim_now()));
        return NVML_SUCCESS;
    case NVML_PCIE_UTIL_RX_BYTES:
        *value = to_uint(value_at(device, M_PCIE_RX, sim_now()));
        return NVML_SUCCESS;
    default:
        return NVML_ERROR_INVALID_ARGUMENT;
    }
}

/* NVLink throughput fields are cumulative KiB counters since the driver (here: nvmlInit)
 * started; a scopeId of UINT_MAX asks for the sum over all links. */
static void nvlink_field(nvmlDevice_t device, nvmlFieldValue_t *v, enum metric m, double now)
{
    if (device->nvlink_links == 0) {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        return;
    }
    double kib = integrate(device, m, sim.t_init, now);
    if (v->scopeId != UINT_MAX) {
        if (v->scopeId >= device->nvlink_links) {
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
            return;
        }
        kib /= device->nvlink_links;
    }
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = kib > 0.0 ? (unsigned long long)kib : 0;
    v->nvmlReturn = NVML_SUCCESS;
}

/* PCIe byte counters: cumulative bytes since the driver (here: nvmlInit) started, from the
 * KB/s series (1 KB = 1024 bytes), wrapping modulo pcie_counter_wrap when that is set. */
static void pcie_field(nvmlDevice_t device, nvmlFieldValue_t *v, enum metric m, double now)
{
    if (!device->pcie_counters) {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        return;
    }
    double bytes = integrate(device, m, sim.t_init, now) * 1024.0;
    unsigned long long count = bytes > 0.0 ? (unsigned long long)bytes : 0;
    if (device->pcie_counter_wrap)
        count %= device->pcie_counter_wrap;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = count;
    v->nvmlReturn = NVML_SUCCESS;
}

/* A fault the scenario injects for one field ("fault field:ID ERROR GPU"). */
static nvmlReturn_t field_fault(nvmlDevice_t device, unsigned int field_id)
{
    char name[32];
    snprintf(name, sizeof name, "field:%u", field_id);
    return injected_fault(name, (int)device->index);
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values)
{
    ENTER(device);
    if (!values || valuesCount < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    double now = sim_now();
    long long stamp = clock_us(CLOCK_REALTIME);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = stamp;
        v->latencyUsec = 0;
        nvmlReturn_t fault = field_fault(device, v->fieldId);
        if (fault != NVML_SUCCESS) {
            v->nvmlReturn = fault;
            continue;
        }
        switch (v->fieldId) {
        case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
        case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX:
            nvlink_field(device, v, M_NVLINK_TX, now);
            break;
        case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
        case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX:
            nvlink_field(device, v, M_NVLINK_RX, now);
            break;
        case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            pcie_field(device, v, M_PCIE_TX, now);
            break;
        case NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            pcie_field(device, v, M_PCIE_RX, now);
            break;
        default:
            v->nvmlReturn = v->fieldId < NVML_FI_MAX ? NVML_ERROR_NOT_SUPPORTED
                                                     : NVML_ERROR_INVALID_ARGUMENT;
            break;
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    ENTER(device);
    if (!power)
        return NVML_ERROR_INVALID_ARGUMENT;
    *power = to_uint(value_at(device, M_POWER, sim_now()));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                    unsigned int *clock)
{
    ENTER(device);
    if (!clock)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM:
        *clock = to_uint(value_at(device, M_SM_CLOCK, sim_now()));
        return NVML_SUCCESS;
    case NVML_CLOCK_MEM:
        *clock = 2619;
        return NVML_SUCCESS;
    case NVML_CLOCK_VIDEO:
        *clock = 1755;
        return NVML_SUCCESS;
    default:
        return NVML_ERROR_INVALID_ARGUMENT;
    }
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp)
{
    ENTER(device);
    if (!temp || sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = to_uint(value_at(device, M_TEMP, sim_now()));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    ENTER(device);
    if (!temperature)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = (int)llround(value_at(device, M_TEMP, sim_now()));
    return NVML_SUCCESS;
}

static unsigned long long clock_reasons(nvmlDevice_t device)
{
    double v = value_at(device, M_REASONS, sim_now());
    return v > 0.0 ? (unsigned long long)v : 0;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                    unsigned long long *clocksEventReasons)
{
    ENTER(device);
    if (!clocksEventReasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    *clocksEventReasons = clock_reasons(device);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons)
{
    ENTER(device);
    if (!clocksThrottleReasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    *clocksThrottleReasons = clock_reasons(device);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Processes                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static int proc_alive(const proc_t *p, double now)
{
    return p->start <= now && now < p->end;
}

/* Size query semantics of the driver: with too small a buffer (or none), the call fails with
 * INSUFFICIENT_SIZE and says how many entries there are; no process at all is a success. */
static nvmlReturn_t running_processes(nvmlDevice_t device, int graphics, unsigned int *infoCount,
                                      nvmlProcessInfo_t *infos)
{
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    double now = sim_now();
    unsigned int n = 0;
    for (size_t i = 0; i < device->n_procs; i++)
        if (device->procs[i].graphics == graphics && proc_alive(&device->procs[i], now))
            n++;
    if (n == 0) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    if (!infos || *infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int j = 0;
    for (size_t i = 0; i < device->n_procs; i++) {
        const proc_t *p = &device->procs[i];
        if (p->graphics != graphics || !proc_alive(p, now))
            continue;
        infos[j].pid = p->pid;
        infos[j].usedGpuMemory = p->mem_bytes;
        infos[j].gpuInstanceId = 0xFFFFFFFFu; /* MIG disabled */
        infos[j].computeInstanceId = 0xFFFFFFFFu;
        j++;
    }
    *infoCount = j;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    ENTER(device);
    return running_processes(device, 0, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    ENTER(device);
    return running_processes(device, 0, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    ENTER(device);
    return running_processes(device, 1, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_v2_t *infos)
{
    ENTER(device);
    return running_processes(device, 1, infoCount, infos);
}

/* One sample per live process with non-zero SM use in the newest sample period, stamped with
 * that period's timestamp; NOT_FOUND when nothing is newer than lastSeenTimeStamp. The size
 * query (NULL buffer) fails with INSUFFICIENT_SIZE, as the driver's does. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    ENTER(device);
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    double now = sim_now();
    unsigned long long stamp = sample_stamp(newest_sample());
    unsigned int n = 0;
    for (size_t i = 0; i < device->n_procs; i++)
        if (proc_alive(&device->procs[i], now) && device->procs[i].sm_util > 0)
            n++;
    if (n == 0 || lastSeenTimeStamp >= stamp)
        return NVML_ERROR_NOT_FOUND;
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int j = 0;
    for (size_t i = 0; i < device->n_procs; i++) {
        const proc_t *p = &device->procs[i];
        if (!proc_alive(p, now) || p->sm_util == 0)
            continue;
        memset(&utilization[j], 0, sizeof utilization[j]);
        utilization[j].pid = p->pid;
        utilization[j].timeStamp = stamp;
        utilization[j].smUtil = p->sm_util;
        j++;
    }
    *processSamplesCount = j;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* GPM (Hopper and newer)                                                                     */
/* ------------------------------------------------------------------------------------------ */

static char GPM_UNIT_PCT[] = "%";

static const struct {
    unsigned int id;
    enum metric m;
    char *short_name;
    char *long_name;
} GPM_METRICS[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, M_UTIL_GPU, (char[]){"GR_UTIL"},
     (char[]){"graphics engine utilization"}},
    {NVML_GPM_METRIC_SM_UTIL, M_SM_ACTIVE, (char[]){"SM_UTIL"}, (char[]){"SM utilization"}},
    {NVML_GPM_METRIC_SM_OCCUPANCY, M_SM_OCCUPANCY, (char[]){"SM_OCCUPANCY"},
     (char[]){"SM occupancy"}},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, M_TENSOR_ACTIVE, (char[]){"ANY_TENSOR_UTIL"},
     (char[]){"any tensor pipe utilization"}},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, M_DRAM_ACTIVE, (char[]){"DRAM_BW_UTIL"},
     (char[]){"DRAM bandwidth utilization"}},
};

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    ENTER(device);
    if (!gpmSupport)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    gpmSupport->isSupportedDevice = device->gpm ? 1u : 0u;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    ENTER(NULL);
    if (!gpmSample)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlGpmSample_t s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_MEMORY;
    s->magic = GPM_SAMPLE_MAGIC;
    *gpmSample = s;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    ENTER(NULL);
    if (!gpmSample || gpmSample->magic != GPM_SAMPLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    gpmSample->magic = 0;
    free(gpmSample);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    ENTER(device);
    if (!gpmSample || gpmSample->magic != GPM_SAMPLE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->gpm)
        return NVML_ERROR_NOT_SUPPORTED;
    gpmSample->dev = device;
    gpmSample->t = sim_now();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    ENTER(NULL);
    if (!metricsGet)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t s1 = metricsGet->sample1, s2 = metricsGet->sample2;
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX || !s1 || !s2 ||
        s1->magic != GPM_SAMPLE_MAGIC || s2->magic != GPM_SAMPLE_MAGIC || !s1->dev ||
        s1->dev != s2->dev)
        return NVML_ERROR_INVALID_ARGUMENT;
    double a = s1->t < s2->t ? s1->t : s2->t;
    double b = s1->t < s2->t ? s2->t : s1->t;
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *out = &metricsGet->metrics[i];
        out->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        out->value = 0.0;
        memset(&out->metricInfo, 0, sizeof out->metricInfo);
        for (size_t j = 0; j < sizeof GPM_METRICS / sizeof GPM_METRICS[0]; j++) {
            if (GPM_METRICS[j].id != out->metricId)
                continue;
            out->metricInfo.shortName = GPM_METRICS[j].short_name;
            out->metricInfo.longName = GPM_METRICS[j].long_name;
            out->metricInfo.unit = GPM_UNIT_PCT;
            if (b > a) {
                out->value = average(s1->dev, GPM_METRICS[j].m, a, b);
                out->nvmlReturn = NVML_SUCCESS;
            } else {
                out->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
            }
        }
    }
    return NVML_SUCCESS;
}
