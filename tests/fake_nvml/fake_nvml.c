/*
 * fake_nvml.c - a stand-in for libnvidia-ml.so, for tests on machines with
 * no GPU.  The real pynvml module loads it (tests/fake_nvml/__init__.py sets
 * pynvml.nvmlLib), so every pynvml wrapper, struct and error class is
 * exercised for real; only the driver underneath is fake.
 *
 * What the "GPUs" report comes from a small text file named by the env var
 * FAKE_NVML_CONFIG.  It is re-read on every call, so a test can rewrite it
 * (atomically, with os.replace) to simulate a GPU lost mid-run, a device
 * count that changes, and so on.  Format, one directive a line, whitespace
 * separated, '#' starts a comment line:
 *
 *   init_error CODE                  nvmlInit* returns CODE (0 = success)
 *   count_error CODE                 nvmlDeviceGetCount* returns CODE
 *   driver_version_error CODE        nvmlSystemGetDriverVersion returns CODE
 *   driver_version TEXT...           rest of the line
 *   device IDX key=N key=N ...       numeric fields, see dev_keys[] below;
 *                                    the device count is max IDX + 1
 *   name IDX TEXT...                 rest of the line (names contain spaces)
 *   uuid IDX TEXT...
 *   error IDX field=CODE ...         per-device error, see field_names[];
 *                                    "all" applies to every per-device call
 *   proc IDX pid=N used=N|na         one compute process on device IDX
 *   gproc IDX pid=N used=N|na        one graphics process on device IDX
 *
 * FAKE_NVML_CONFIG unset means "no GPUs, no errors"; set but unreadable
 * makes every call return NVML_ERROR_UNKNOWN, so a wrong path is loud.
 *
 * Structs and signatures follow nvml.h as mirrored by pynvml's ctypes
 * definitions (c_nvmlMemory_t, c_nvmlMemory_v2_t, c_nvmlUtilization_t,
 * c_nvmlProcessInfo_v2_t == c_nvmlProcessInfo_v3_t).
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Build with -fvisibility=hidden so only the NVML API is exported. */
#define EXPORT __attribute__((visibility("default")))

/* ---- NVML types and constants (values from nvml.h / pynvml) ---------- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum { NVML_TEMPERATURE_GPU = 0 };
enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2,
       NVML_CLOCK_VIDEO = 3 };

/* nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) = sizeof | (2 << 24). */
#define NVML_MEMORY_V2_VERSION 0x02000028u

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

/* nvmlProcessInfo_v2_t; the _v2 and _v3 process calls both use it. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU microseconds since the epoch */
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t layout");

/* NVML_VALUE_NOT_AVAILABLE: pynvml turns usedGpuMemory == this into None. */
#define NOT_AVAILABLE ULLONG_MAX
/* Instance ids NVML reports for processes when MIG is off. */
#define NO_INSTANCE 0xFFFFFFFFu

/* Handles point into this static array, so they are never NULL and stay
 * valid for the life of the process, like real NVML handles.  The device
 * index is the position in the array. */
#define MAX_DEVICES 32
typedef struct nvmlDevice_st { unsigned char unused; } *nvmlDevice_t;
static struct nvmlDevice_st g_handles[MAX_DEVICES];

/* Index of a handle, or -1 for anything that is not one of ours. */
static int handle_index(nvmlDevice_t h)
{
    uintptr_t off = (uintptr_t)h - (uintptr_t)g_handles;
    if (!h || off % sizeof *h || off / sizeof *h >= MAX_DEVICES)
        return -1;
    return (int)(off / sizeof *h);
}

/* nvmlInit/nvmlShutdown reference count; atomic because the monitor under
 * test samples from a background thread. */
static int g_init_refs;

static int initialized(void)
{
    return __atomic_load_n(&g_init_refs, __ATOMIC_SEQ_CST) > 0;
}

/* ---- configuration ---------------------------------------------------- */

/* Per-device error fields, in the order of field_names[]. */
enum field {
    F_HANDLE, F_NAME, F_UUID, F_UTIL, F_MEMORY, F_TEMP, F_FAN, F_POWER,
    F_POWER_LIMIT, F_CLOCK_SM, F_CLOCK_MEM, F_CLOCK_GRAPHICS, F_PROCS,
    F_GRAPHICS_PROCS, F_PROC_UTIL, F_ALL, N_FIELDS
};
static const char *const field_names[N_FIELDS] = {
    "handle", "name", "uuid", "util", "memory", "temp", "fan", "power",
    "power_limit", "clock_sm", "clock_mem", "clock_graphics", "procs",
    "graphics_procs", "proc_util", "all",
};

/* Numeric device fields, in the order of dev_keys[].  NOT_AVAILABLE marks
 * "not given", which lets a few fields default from others. */
enum dev_key {
    K_UTIL_GPU, K_UTIL_MEM, K_MEM_TOTAL, K_MEM_USED, K_MEM_FREE,
    K_MEM_RESERVED, K_TEMP, K_FAN, K_POWER_MW, K_POWER_LIMIT_MW,
    K_POWER_MGMT_LIMIT_MW, K_SM_CLOCK, K_MEM_CLOCK, K_GRAPHICS_CLOCK, N_KEYS
};
static const char *const dev_keys[N_KEYS] = {
    "util_gpu", "util_mem", "mem_total", "mem_used", "mem_free",
    "mem_reserved", "temp", "fan", "power_mw", "power_limit_mw",
    "power_mgmt_limit_mw", "sm_clock", "mem_clock", "graphics_clock",
};

#define NAME_LEN 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define MAX_PROCS 256

struct dev {
    unsigned long long v[N_KEYS];
    char name[NAME_LEN];
    char uuid[NAME_LEN];
    int err[N_FIELDS];
};

struct proc {
    unsigned int dev, pid;
    unsigned long long used;
    int sm; /* SM utilisation %, -1: no utilisation sample */
};

struct cfg {
    int init_error, count_error, driver_version_error;
    char driver_version[80];
    unsigned int count;
    struct dev dev[MAX_DEVICES];
    unsigned int n_procs[2]; /* [0] compute, [1] graphics */
    struct proc procs[2][MAX_PROCS];
};

static unsigned long long dev_val(const struct dev *d, enum dev_key k,
                                  unsigned long long dflt)
{
    return d->v[k] == NOT_AVAILABLE ? dflt : d->v[k];
}

static int lookup(const char *const *names, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && strncmp(names[i], s, len) == 0)
            return i;
    return -1;
}

/* Copy the rest of a line (after leading blanks) without its newline. */
static void copy_rest(char *dst, size_t size, const char *src)
{
    src += strspn(src, " \t");
    size_t n = strcspn(src, "\r\n");
    if (n >= size)
        n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Device index argument of a directive; -1 if missing or out of range. */
static int parse_index(char **save)
{
    char *tok = strtok_r(NULL, " \t\r\n", save);
    if (!tok)
        return -1;
    char *end;
    long i = strtol(tok, &end, 10);
    return (*end || i < 0 || i >= MAX_DEVICES) ? -1 : (int)i;
}

static unsigned long long parse_num(const char *s)
{
    return strcmp(s, "na") == 0 ? NOT_AVAILABLE : strtoull(s, NULL, 0);
}

static void parse_line(struct cfg *c, char *line)
{
    char buf[1024];
    char *save, *kw, *tok;
    int idx;

    snprintf(buf, sizeof buf, "%s", line); /* strtok_r writes into it */
    kw = strtok_r(buf, " \t\r\n", &save);
    if (!kw || kw[0] == '#')
        return;

    if (strcmp(kw, "init_error") == 0 || strcmp(kw, "count_error") == 0 ||
        strcmp(kw, "driver_version_error") == 0) {
        tok = strtok_r(NULL, " \t\r\n", &save);
        int code = tok ? (int)strtol(tok, NULL, 0) : 0;
        if (kw[0] == 'i')
            c->init_error = code;
        else if (kw[0] == 'c')
            c->count_error = code;
        else
            c->driver_version_error = code;
        return;
    }
    if (strcmp(kw, "driver_version") == 0) {
        copy_rest(c->driver_version, sizeof c->driver_version,
                  line + (kw - buf) + strlen(kw));
        return;
    }

    idx = parse_index(&save);
    if (idx < 0)
        return;

    if (strcmp(kw, "name") == 0 || strcmp(kw, "uuid") == 0) {
        /* Everything after the index, taken from the untouched line. */
        const char *rest = line + (save - buf);
        copy_rest(kw[0] == 'n' ? c->dev[idx].name : c->dev[idx].uuid,
                  NAME_LEN, rest);
        if ((unsigned)idx + 1 > c->count)
            c->count = idx + 1;
        return;
    }

    if (strcmp(kw, "device") == 0) {
        if ((unsigned)idx + 1 > c->count)
            c->count = idx + 1;
        while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
            char *eq = strchr(tok, '=');
            int k = eq ? lookup(dev_keys, N_KEYS, tok, eq - tok) : -1;
            if (k >= 0)
                c->dev[idx].v[k] = parse_num(eq + 1);
        }
    } else if (strcmp(kw, "error") == 0) {
        while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
            char *eq = strchr(tok, '=');
            int f = eq ? lookup(field_names, N_FIELDS, tok, eq - tok) : -1;
            if (f >= 0)
                c->dev[idx].err[f] = (int)strtol(eq + 1, NULL, 0);
        }
    } else if (strcmp(kw, "proc") == 0 || strcmp(kw, "gproc") == 0) {
        int kind = kw[0] == 'g';
        if (c->n_procs[kind] >= MAX_PROCS)
            return;
        struct proc *p = &c->procs[kind][c->n_procs[kind]++];
        p->dev = idx;
        p->pid = 0;
        p->used = NOT_AVAILABLE;
        p->sm = -1;
        while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
            if (strncmp(tok, "pid=", 4) == 0)
                p->pid = (unsigned)strtoul(tok + 4, NULL, 0);
            else if (strncmp(tok, "used=", 5) == 0)
                p->used = parse_num(tok + 5);
            else if (strncmp(tok, "sm=", 3) == 0)
                p->sm = (int)strtol(tok + 3, NULL, 0);
        }
    }
}

/* Read the config afresh.  Heap-allocated (the struct is ~30 KiB) and
 * per call, so concurrent callers never share mutable state. */
static struct cfg *cfg_load(nvmlReturn_t *rc)
{
    struct cfg *c = calloc(1, sizeof *c);
    *rc = NVML_SUCCESS;
    if (!c) {
        *rc = NVML_ERROR_UNKNOWN;
        return NULL;
    }
    snprintf(c->driver_version, sizeof c->driver_version, "999.99.fake");
    for (int i = 0; i < MAX_DEVICES; i++) {
        for (int k = 0; k < N_KEYS; k++)
            c->dev[i].v[k] = NOT_AVAILABLE;
        snprintf(c->dev[i].name, NAME_LEN, "FakeGPU-%d", i);
        snprintf(c->dev[i].uuid, NAME_LEN,
                 "GPU-fa6e0000-0000-0000-0000-%012d", i);
    }

    const char *path = getenv("FAKE_NVML_CONFIG");
    if (!path || !*path)
        return c;
    FILE *f = fopen(path, "r");
    if (!f) {
        free(c);
        *rc = NVML_ERROR_UNKNOWN;
        return NULL;
    }
    char line[1024];
    while (fgets(line, sizeof line, f))
        parse_line(c, line);
    fclose(f);
    return c;
}

static void cfg_freep(struct cfg **c) { free(*c); }
#define AUTO_CFG __attribute__((cleanup(cfg_freep))) struct cfg

/* Common prologue: initialised?  config readable? */
static nvmlReturn_t begin(struct cfg **c)
{
    nvmlReturn_t rc;
    *c = NULL;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    *c = cfg_load(&rc);
    return rc;
}

/* Prologue for per-device calls: resolves the handle and applies the
 * configured error for `field` (a field-specific code beats "all"). */
static nvmlReturn_t begin_dev(nvmlDevice_t h, enum field field,
                              struct cfg **c, const struct dev **d)
{
    nvmlReturn_t rc = begin(c);
    if (rc != NVML_SUCCESS)
        return rc;
    int idx = handle_index(h);
    if (idx < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* A handle whose device vanished from the config acts like a GPU that
     * fell off the bus. */
    if ((unsigned)idx >= (*c)->count)
        return NVML_ERROR_GPU_IS_LOST;
    *d = &(*c)->dev[idx];
    if ((*d)->err[field])
        return (*d)->err[field];
    return (*d)->err[F_ALL];
}

/* NVML's string-out convention: too small a buffer is INSUFFICIENT_SIZE. */
static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- init / shutdown / system ----------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t rc;
    struct cfg *c = cfg_load(&rc);
    if (rc == NVML_SUCCESS)
        rc = c->init_error;
    free(c);
    if (rc == NVML_SUCCESS)
        __atomic_add_fetch(&g_init_refs, 1, __ATOMIC_SEQ_CST);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    int refs = __atomic_load_n(&g_init_refs, __ATOMIC_SEQ_CST);
    while (refs > 0)
        if (__atomic_compare_exchange_n(&g_init_refs, &refs, refs - 1, 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return NVML_SUCCESS;
    return NVML_ERROR_UNINITIALIZED;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version,
                                               unsigned int length)
{
    AUTO_CFG *c;
    nvmlReturn_t rc = begin(&c);
    if (rc == NVML_SUCCESS)
        rc = c->driver_version_error;
    return rc ? rc : copy_out(version, length, c->driver_version);
}

/* ---- device enumeration ----------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    AUTO_CFG *c;
    nvmlReturn_t rc = begin(&c);
    if (rc == NVML_SUCCESS)
        rc = c->count_error;
    if (rc == NVML_SUCCESS && !count)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *count = c->count;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return nvmlDeviceGetCount_v2(count);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                  nvmlDevice_t *device)
{
    AUTO_CFG *c;
    nvmlReturn_t rc = begin(&c);
    if (rc != NVML_SUCCESS)
        return rc;
    if (index >= c->count || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct dev *d = &c->dev[index];
    rc = d->err[F_HANDLE] ? d->err[F_HANDLE] : d->err[F_ALL];
    if (rc == NVML_SUCCESS)
        *device = &g_handles[index];
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index,
                                               nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* ---- per-device queries ----------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name,
                                      unsigned int length)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_NAME, &c, &d);
    return rc ? rc : copy_out(name, length, d->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid,
                                      unsigned int length)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_UUID, &c, &d);
    return rc ? rc : copy_out(uuid, length, d->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                  nvmlUtilization_t *util)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_UTIL, &c, &d);
    if (rc)
        return rc;
    if (!util)
        return NVML_ERROR_INVALID_ARGUMENT;
    util->gpu = (unsigned)dev_val(d, K_UTIL_GPU, 0);
    util->memory = (unsigned)dev_val(d, K_UTIL_MEM, 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device,
                                            nvmlMemory_t *memory)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_MEMORY, &c, &d);
    if (rc)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total = dev_val(d, K_MEM_TOTAL, 0);
    unsigned long long used = dev_val(d, K_MEM_USED, 0);
    memory->total = total;
    memory->used = used;
    memory->free = dev_val(d, K_MEM_FREE, total > used ? total - used : 0);
    return NVML_SUCCESS;
}

/* pynvml calls this only when given version=nvmlMemory_v2. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                               nvmlMemory_v2_t *memory)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_MEMORY, &c, &d);
    if (rc)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total = dev_val(d, K_MEM_TOTAL, 0);
    unsigned long long used = dev_val(d, K_MEM_USED, 0);
    unsigned long long reserved = dev_val(d, K_MEM_RESERVED, 0);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = dev_val(d, K_MEM_FREE, total > used + reserved
                                              ? total - used - reserved : 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                             int sensorType,
                                             unsigned int *temp)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_TEMP, &c, &d);
    if (rc)
        return rc;
    if (sensorType != NVML_TEMPERATURE_GPU || !temp)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned)dev_val(d, K_TEMP, 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device,
                                          unsigned int *speed)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_FAN, &c, &d);
    if (rc)
        return rc;
    if (!speed)
        return NVML_ERROR_INVALID_ARGUMENT;
    *speed = (unsigned)dev_val(d, K_FAN, 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device,
                                            unsigned int *power)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_POWER, &c, &d);
    if (rc)
        return rc;
    if (!power)
        return NVML_ERROR_INVALID_ARGUMENT;
    *power = (unsigned)dev_val(d, K_POWER_MW, 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device,
                                                    unsigned int *limit)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_POWER_LIMIT, &c, &d);
    if (rc)
        return rc;
    if (!limit)
        return NVML_ERROR_INVALID_ARGUMENT;
    *limit = (unsigned)dev_val(d, K_POWER_LIMIT_MW, 0);
    return NVML_SUCCESS;
}

/* The management limit defaults to the enforced one, as on most boards. */
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device,
                                                      unsigned int *limit)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_POWER_LIMIT, &c, &d);
    if (rc)
        return rc;
    if (!limit)
        return NVML_ERROR_INVALID_ARGUMENT;
    *limit = (unsigned)dev_val(d, K_POWER_MGMT_LIMIT_MW,
                               dev_val(d, K_POWER_LIMIT_MW, 0));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type,
                                           unsigned int *clock)
{
    enum field f;
    switch (type) {
    case NVML_CLOCK_GRAPHICS: f = F_CLOCK_GRAPHICS; break;
    case NVML_CLOCK_SM: f = F_CLOCK_SM; break;
    case NVML_CLOCK_MEM: f = F_CLOCK_MEM; break;
    case NVML_CLOCK_VIDEO: f = F_ALL; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, f, &c, &d);
    if (rc)
        return rc;
    if (!clock)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long sm = dev_val(d, K_SM_CLOCK, 0);
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
        *clock = (unsigned)dev_val(d, K_GRAPHICS_CLOCK, sm); /* = SM clock */
        return NVML_SUCCESS;
    case NVML_CLOCK_SM:
        *clock = (unsigned)sm;
        return NVML_SUCCESS;
    case NVML_CLOCK_MEM:
        *clock = (unsigned)dev_val(d, K_MEM_CLOCK, 0);
        return NVML_SUCCESS;
    default: /* video clock is not modelled */
        return NVML_ERROR_NOT_SUPPORTED;
    }
}

/* NVML's two-call protocol: with too small a buffer (pynvml's first call
 * passes NULL and *count == 0) return INSUFFICIENT_SIZE and the needed
 * count, or SUCCESS with count 0 when there is nothing to report. */
static nvmlReturn_t get_procs(nvmlDevice_t device, int kind,
                              unsigned int *count, nvmlProcessInfo_t *infos)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, kind ? F_GRAPHICS_PROCS : F_PROCS,
                                &c, &d);
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;

    unsigned int idx = (unsigned)handle_index(device), n = 0;
    for (unsigned int i = 0; i < c->n_procs[kind]; i++)
        n += c->procs[kind][i].dev == idx;
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (*count < n || !infos) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }

    unsigned int j = 0;
    for (unsigned int i = 0; i < c->n_procs[kind]; i++) {
        const struct proc *p = &c->procs[kind][i];
        if (p->dev != idx)
            continue;
        infos[j].pid = p->pid;
        infos[j].usedGpuMemory = p->used;
        infos[j].gpuInstanceId = NO_INSTANCE;
        infos[j].computeInstanceId = NO_INSTANCE;
        j++;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(
    nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return get_procs(device, 0, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(
    nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return get_procs(device, 0, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(
    nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return get_procs(device, 1, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(
    nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return get_procs(device, 1, count, infos);
}

/* One utilisation sample, taken now, per compute process of the device
 * that has one (its sm=); none: NOT_FOUND, as NVML answers when no process
 * ran since lastSeenTimeStamp.  The two-call protocol of get_procs(). */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(
    nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
    unsigned int *count, unsigned long long lastSeenTimeStamp)
{
    AUTO_CFG *c;
    const struct dev *d;
    nvmlReturn_t rc = begin_dev(device, F_PROC_UTIL, &c, &d);
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    (void)lastSeenTimeStamp;

    unsigned int idx = (unsigned)handle_index(device), n = 0;
    for (unsigned int i = 0; i < c->n_procs[0]; i++)
        n += c->procs[0][i].dev == idx && c->procs[0][i].sm >= 0;
    if (n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (*count < n || !samples) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned int j = 0;
    for (unsigned int i = 0; i < c->n_procs[0]; i++) {
        const struct proc *p = &c->procs[0][i];
        if (p->dev != idx || p->sm < 0)
            continue;
        samples[j].pid = p->pid;
        samples[j].timeStamp = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000ULL;
        samples[j].smUtil = (unsigned)p->sm;
        samples[j].memUtil = samples[j].encUtil = samples[j].decUtil = 0;
        j++;
    }
    *count = n;
    return NVML_SUCCESS;
}

/* ---- test-only hooks (not NVML API) ----------------------------------- */

/* dlopen of the same path returns the same, already-initialised copy, so
 * the Python loader resets the refcount to start each test clean. */
EXPORT void fakeNvmlReset(void)
{
    __atomic_store_n(&g_init_refs, 0, __ATOMIC_SEQ_CST);
}

/* Lets tests assert that the code under test balanced init and shutdown. */
EXPORT int fakeNvmlInitRefcount(void)
{
    return __atomic_load_n(&g_init_refs, __ATOMIC_SEQ_CST);
}
