/* ogh-check: what a container sees of the NVIDIA GPU oci-gpu-hook gave it.  Built on the GPU host by
 * device/check-h200.sh with its own compiler and run as the container's only process.
 *
 *   ogh-check MAJOR:MINOR...
 *
 * Prints "node PATH MAJOR:MINOR" for each /dev/nvidia* node, "c MAJOR:MINOR RESULT" for each argument (a fresh node
 * made on /tmp and opened: OPEN or ENXIO = the device cgroup allows it, EPERM = it refuses it), "smi LINE" for each
 * line of `nvidia-smi -L`, and "cuda init=R count=N" from libcuda.so.1 (cuInit, cuDeviceGetCount), then "done".
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
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
    static const char *const paths[] = {"/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi", "/bin/nvidia-smi"};
    const char *found = NULL;
    for (size_t i = 0; i < sizeof paths / sizeof *paths && !found; i++)
        if (access(paths[i], X_OK) == 0)
            found = paths[i];
    if (!found) {
        printf("smi-missing\n");
        return;
    }
    int fds[2];
    if (pipe(fds) != 0)
        return;
    pid_t child = fork();
    if (child == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        execl(found, "nvidia-smi", "-L", (char *)NULL);
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

static void cuda(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("cuda dlopen-failed %s\n", dlerror());
        return;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
    if (!init || !count) {
        printf("cuda dlsym-failed\n");
        return;
    }
    int n = -1;
    int r = init(0);
    int c = r == 0 ? count(&n) : -1;
    printf("cuda init=%d count=%d (status %d)\n", r, n, c);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    nodes();
    for (int i = 1; i < argc; i++)
        probe(argv[i]);
    smi();
    cuda();
    printf("done\n");
    return 0;
}
