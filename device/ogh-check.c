/* ogh-check: what a container sees of the NVIDIA GPU oci-gpu-hook gave it.  Built on the GPU machine by
 * device/check.sh with its own compiler (cc -O2 -o ogh-check ogh-check.c -ldl) and run as the container's only
 * process.  It links against nothing of NVIDIA's or of the loaders: everything is dlopen'ed, so that the same
 * binary says what is missing instead of failing to start.
 *
 *   ogh-check MAJOR:MINOR...
 *
 * Each part runs in a child of its own (a crash in one is reported as "PART crashed signal N", the others go on)
 * and prints lines that device/check.sh judges:
 *   node PATH MAJOR:MINOR      each /dev/nvidia* character node
 *   c MAJOR:MINOR RESULT       each argument: a fresh node made on /tmp and opened (OPEN or ENXIO: the device
 *                              cgroup allows it; EPERM: it refuses it)
 *   smi LINE / smi-status N    `nvidia-smi -L`, found through the container's PATH (execvp)
 *   cuda ok|fail ...           libcuda.so.1 through the driver API: a PTX kernel loaded, launched on device 0,
 *                              its output checked
 *   egl ok|fail ...            libEGL.so.1 (glvnd): the devices it enumerates, device 0's display initialised,
 *                              its EGL_VENDOR
 *   vulkan ok|fail ...         libvulkan.so.1: an instance, its physical devices, the first one's vendor and name
 * then "done".
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *name(int err) {
    switch (err) {
    case 0: return "OPEN";
    case ENXIO: return "ENXIO";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case ENODEV: return "ENODEV";
    case ENOENT: return "ENOENT";
    default: return strerror(err);
    }
}

static void probe(const char *arg) {
    unsigned major, minor;
    char path[64];
    if (sscanf(arg, "%u:%u", &major, &minor) != 2) {
        printf("c %s BAD-ARGUMENT\n", arg);
        return;
    }
    snprintf(path, sizeof path, "/tmp/ogh-%u-%u", major, minor);
    unlink(path);
    if (mknod(path, S_IFCHR | 0666, makedev(major, minor)) != 0) {
        printf("c %u:%u MKNOD-%s\n", major, minor, name(errno));
        return;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0)
        close(fd);
    unlink(path);
    printf("c %u:%u %s\n", major, minor, name(err));
}

static void nodes(void) {
    DIR *dir = opendir("/dev");
    struct dirent *entry;
    char path[300];
    struct stat st;
    if (!dir)
        return;
    while ((entry = readdir(dir)) != NULL) {
        if (strncmp(entry->d_name, "nvidia", 6) != 0)
            continue;
        snprintf(path, sizeof path, "/dev/%s", entry->d_name);
        if (lstat(path, &st) == 0 && S_ISCHR(st.st_mode))
            printf("node %s %u:%u\n", path, major(st.st_rdev), minor(st.st_rdev));
    }
    closedir(dir);
}

static void smi(void) {
    int fds[2];
    if (pipe(fds) != 0)
        return;
    pid_t child = fork();
    if (child == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        execlp("nvidia-smi", "nvidia-smi", "-L", (char *)NULL);  /* PATH as the image sets it */
        printf("nvidia-smi not found on PATH=%s: %s\n", getenv("PATH") ? getenv("PATH") : "", strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    FILE *out = fdopen(fds[0], "r");
    char line[512];
    while (out && fgets(line, sizeof line, out))
        printf("smi %s", line);
    if (out)
        fclose(out);
    int status = 0;
    waitpid(child, &status, 0);
    printf("smi-status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

/* --- CUDA, driver API: out[i] = 3 * i + 7 for i < n, written by a kernel given as PTX text.  PTX ISA 6.0 for
 * sm_50: the driver JIT-compiles it for whatever GPU it has (PTX is forward compatible), and any driver of the
 * last years reads ISA 6.0 (nvcc's own PTX of a newer toolkit may be too new for the driver, and a program
 * linked with a newer CUDA runtime fails with "driver version is insufficient"). */
static const char PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry ogh_fill(\n"
    "    .param .u64 ogh_fill_out,\n"
    "    .param .u32 ogh_fill_n\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<5>;\n"
    "\n"
    "    ld.param.u64 %rd1, [ogh_fill_out];\n"
    "    ld.param.u32 %r2, [ogh_fill_n];\n"
    "    mov.u32 %r3, %ctaid.x;\n"
    "    mov.u32 %r4, %ntid.x;\n"
    "    mov.u32 %r5, %tid.x;\n"
    "    mad.lo.s32 %r1, %r3, %r4, %r5;\n"
    "    setp.ge.s32 %p1, %r1, %r2;\n"
    "    @%p1 bra DONE;\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mul.wide.s32 %rd3, %r1, 4;\n"
    "    add.s64 %rd4, %rd2, %rd3;\n"
    "    mul.lo.s32 %r6, %r1, 3;\n"
    "    add.s32 %r7, %r6, 7;\n"
    "    st.global.u32 [%rd4], %r7;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

typedef int (*cu_int_fn)(unsigned);
#define CU_LOOKUP(lib, var, sym)                                     \
    do {                                                             \
        *(void **)(&var) = dlsym(lib, sym);                          \
        if (!var) {                                                  \
            printf("cuda fail: libcuda.so.1 has no %s\n", sym);    \
            return;                                                  \
        }                                                            \
    } while (0)

static void cuda(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("cuda fail: dlopen libcuda.so.1: %s\n", dlerror());
        return;
    }
    int (*cuInit)(unsigned);
    int (*cuDeviceGetCount)(int *);
    int (*cuDeviceGet)(int *, int);
    int (*cuDeviceGetName)(char *, int, int);
    int (*cuCtxCreate)(void **, unsigned, int);
    int (*cuModuleLoadData)(void **, const void *);
    int (*cuModuleGetFunction)(void **, void *, const char *);
    int (*cuMemAlloc)(unsigned long long *, size_t);
    int (*cuMemcpyDtoH)(void *, unsigned long long, size_t);
    int (*cuLaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                          void **, void **);
    int (*cuCtxSynchronize)(void);
    int (*cuGetErrorString)(int, const char **);
    CU_LOOKUP(lib, cuInit, "cuInit");
    CU_LOOKUP(lib, cuDeviceGetCount, "cuDeviceGetCount");
    CU_LOOKUP(lib, cuDeviceGet, "cuDeviceGet");
    CU_LOOKUP(lib, cuDeviceGetName, "cuDeviceGetName");
    CU_LOOKUP(lib, cuCtxCreate, "cuCtxCreate_v2");
    CU_LOOKUP(lib, cuModuleLoadData, "cuModuleLoadData");
    CU_LOOKUP(lib, cuModuleGetFunction, "cuModuleGetFunction");
    CU_LOOKUP(lib, cuMemAlloc, "cuMemAlloc_v2");
    CU_LOOKUP(lib, cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    CU_LOOKUP(lib, cuLaunchKernel, "cuLaunchKernel");
    CU_LOOKUP(lib, cuCtxSynchronize, "cuCtxSynchronize");
    CU_LOOKUP(lib, cuGetErrorString, "cuGetErrorString");
    int count = -1, device = 0, r;
    char device_name[256] = "?";
    void *ctx = NULL, *module = NULL, *function = NULL;
    unsigned long long out = 0;
    unsigned n = 1024;
    const char *step = "cuInit";
    if ((r = cuInit(0)) != 0)
        goto failed;
    step = "cuDeviceGetCount";
    if ((r = cuDeviceGetCount(&count)) != 0)
        goto failed;
    step = "cuDeviceGet";
    if ((r = cuDeviceGet(&device, 0)) != 0)
        goto failed;
    cuDeviceGetName(device_name, sizeof device_name, device);
    step = "cuCtxCreate";
    if ((r = cuCtxCreate(&ctx, 0, device)) != 0)
        goto failed;
    step = "cuModuleLoadData (the PTX)";
    if ((r = cuModuleLoadData(&module, PTX)) != 0)
        goto failed;
    step = "cuModuleGetFunction";
    if ((r = cuModuleGetFunction(&function, module, "ogh_fill")) != 0)
        goto failed;
    step = "cuMemAlloc";
    if ((r = cuMemAlloc(&out, n * sizeof(unsigned))) != 0)
        goto failed;
    void *params[] = {&out, &n};
    step = "cuLaunchKernel";
    if ((r = cuLaunchKernel(function, n / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL)) != 0)
        goto failed;
    step = "cuCtxSynchronize";
    if ((r = cuCtxSynchronize()) != 0)
        goto failed;
    unsigned *host = calloc(n, sizeof *host);
    step = "cuMemcpyDtoH";
    if (!host || (r = cuMemcpyDtoH(host, out, n * sizeof *host)) != 0)
        goto failed;
    for (unsigned i = 0; i < n; i++)
        if (host[i] != 3 * i + 7) {
            printf("cuda fail: the kernel wrote %u at %u, not %u (devices %d, device 0 %s)\n", host[i], i,
                   3 * i + 7, count, device_name);
            return;
        }
    printf("cuda ok: %u results of a PTX kernel right on device 0 (%s), %d device(s) visible\n", n, device_name,
           count);
    return;
failed:;
    const char *said = "?";
    cuGetErrorString(r, &said);
    printf("cuda fail: %s returned %d (%s); %d device(s) visible\n", step, r, said ? said : "?", count);
}

/* --- EGL (glvnd's libEGL.so.1 and the vendor library its egl_vendor.d JSON names) --- */
#define EGL_PLATFORM_DEVICE_EXT 0x313F
#define EGL_VENDOR 0x3053

static void egl(void) {
    void *lib = dlopen("libEGL.so.1", RTLD_NOW);
    if (!lib) {
        printf("egl fail: dlopen libEGL.so.1: %s\n", dlerror());
        return;
    }
    void *(*getproc)(const char *) = (void *(*)(const char *))dlsym(lib, "eglGetProcAddress");
    if (!getproc) {
        printf("egl fail: libEGL.so.1 has no eglGetProcAddress\n");
        return;
    }
    unsigned (*query_devices)(int, void **, int *) = (unsigned (*)(int, void **, int *))getproc("eglQueryDevicesEXT");
    void *(*platform_display)(unsigned, void *, const int *) =
        (void *(*)(unsigned, void *, const int *))getproc("eglGetPlatformDisplayEXT");
    unsigned (*initialize)(void *, int *, int *) = (unsigned (*)(void *, int *, int *))dlsym(lib, "eglInitialize");
    const char *(*query_string)(void *, int) = (const char *(*)(void *, int))dlsym(lib, "eglQueryString");
    int (*get_error)(void) = (int (*)(void))dlsym(lib, "eglGetError");
    if (!query_devices || !platform_display || !initialize || !query_string) {
        printf("egl fail: no EGL_EXT_device_enumeration/EGL_EXT_platform_device (no vendor library loaded?)\n");
        return;
    }
    void *devices[16];
    int count = 0;
    if (!query_devices(16, devices, &count) || count < 1) {
        printf("egl fail: eglQueryDevicesEXT found %d device(s) (error 0x%x): the NVIDIA ICD was not found or "
               "did not load\n", count, get_error ? get_error() : 0);
        return;
    }
    void *display = platform_display(EGL_PLATFORM_DEVICE_EXT, devices[0], NULL);
    int major = 0, minor = 0;
    if (!display || !initialize(display, &major, &minor)) {
        printf("egl fail: %d device(s), but device 0's display does not initialise (error 0x%x)\n", count,
               get_error ? get_error() : 0);
        return;
    }
    const char *vendor = query_string(display, EGL_VENDOR);
    printf("egl %s: %d device(s), EGL %d.%d, vendor %s\n", vendor && strstr(vendor, "NVIDIA") ? "ok" : "fail",
           count, major, minor, vendor ? vendor : "?");
}

/* --- Vulkan (the loader libvulkan.so.1 and the ICD its icd.d JSON names); structures by their C layout --- */
struct vk_application_info {
    int s_type;  /* VK_STRUCTURE_TYPE_APPLICATION_INFO = 0 */
    const void *next;
    const char *application_name;
    uint32_t application_version;
    const char *engine_name;
    uint32_t engine_version;
    uint32_t api_version;
};
struct vk_instance_create_info {
    int s_type;  /* VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1 */
    const void *next;
    uint32_t flags;
    const struct vk_application_info *application;
    uint32_t layer_count;
    const char *const *layers;
    uint32_t extension_count;
    const char *const *extensions;
};

static void vulkan(void) {
    void *lib = dlopen("libvulkan.so.1", RTLD_NOW);
    if (!lib) {
        printf("vulkan fail: dlopen libvulkan.so.1: %s\n", dlerror());
        return;
    }
    typedef void (*vk_void_fn)(void);
    vk_void_fn (*get_instance_proc)(void *, const char *) =
        (vk_void_fn (*)(void *, const char *))dlsym(lib, "vkGetInstanceProcAddr");
    if (!get_instance_proc) {
        printf("vulkan fail: libvulkan.so.1 has no vkGetInstanceProcAddr\n");
        return;
    }
    int (*create_instance)(const struct vk_instance_create_info *, const void *, void **) =
        (int (*)(const struct vk_instance_create_info *, const void *, void **))get_instance_proc(
            NULL, "vkCreateInstance");
    struct vk_application_info app = {0, NULL, "ogh-check", 1, "none", 0, (1u << 22)};  /* Vulkan 1.0 */
    struct vk_instance_create_info info = {1, NULL, 0, &app, 0, NULL, 0, NULL};
    void *instance = NULL;
    int r = create_instance ? create_instance(&info, NULL, &instance) : -999;
    if (r != 0) {
        printf("vulkan fail: vkCreateInstance returned %d (-9: no ICD found or loaded)\n", r);
        return;
    }
    int (*enumerate)(void *, uint32_t *, void **) =
        (int (*)(void *, uint32_t *, void **))get_instance_proc(instance, "vkEnumeratePhysicalDevices");
    void (*properties)(void *, void *) = (void (*)(void *, void *))get_instance_proc(
        instance, "vkGetPhysicalDeviceProperties");
    void *devices[16];
    uint32_t count = 16;
    r = enumerate ? enumerate(instance, &count, devices) : -999;
    if ((r != 0 && r != 5 /* VK_INCOMPLETE */) || count < 1) {
        printf("vulkan fail: vkEnumeratePhysicalDevices returned %d, %u device(s)\n", r, count);
        return;
    }
    /* VkPhysicalDeviceProperties: apiVersion, driverVersion, vendorID, deviceID, deviceType, deviceName[256], ... */
    static unsigned char props[4096] __attribute__((aligned(16)));
    properties(devices[0], props);
    uint32_t vendor;
    memcpy(&vendor, props + 8, sizeof vendor);
    char device_name[257] = {0};
    memcpy(device_name, props + 20, 256);
    printf("vulkan %s: %u device(s), device 0 vendor 0x%04x (%s)\n", vendor == 0x10de ? "ok" : "fail", count,
           vendor, device_name);
}

static void part(const char *what, void (*fn)(void)) {
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        fn();
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) < 0) {
        printf("%s fail: cannot fork\n", what);
        return;
    }
    if (WIFSIGNALED(status))
        printf("%s fail: crashed with signal %d\n", what, WTERMSIG(status));
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    nodes();
    for (int i = 1; i < argc; i++)
        probe(argv[i]);
    part("smi", smi);
    part("cuda", cuda);
    part("egl", egl);
    part("vulkan", vulkan);
    printf("done\n");
    return 0;
}
