/* oci-gpu-hook native front, the shim: the runtime's argv and the runtime itself: a part of front.c, which #includes it (one compile; not built alone).
 *
 * Mirrors: oci_gpu_hook/oci_argv.py parse_argv and config_path (common_config_path, for runc and for crun),
 * oci_gpu_hook/entry/runtime.py resolve_runtime (find_runtime).
 */

/* ------------------------------------------------------------------ the shim */

#if OGH_ROLE == OGH_ROLE_SHIM
static char g_runtime[PATH_MAX];

/* resolve_runtime() of oci_gpu_hook/entry/runtime.py: a name with a slash as it is, else the first
 * executable non-directory on PATH; never this front or its Python launcher. */
static int find_runtime(const char *name)
{
    struct stat st;
    char me[PATH_MAX], real[PATH_MAX], script[PATH_MAX];
    if (!name || !name[0])
        return 0;
    if (strchr(name, '/')) {
        if (strlen(name) >= sizeof g_runtime)
            return 0;
        strcpy(g_runtime, name);
    } else {
        const char *search = getenv("PATH");
        const char *p;
        int found = 0;
        if (!search || !search[0])
            search = OGH_DEFAULT_PATH;
        p = search;
        while (!found) {
            const char *colon = strchr(p, ':');
            size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
            int w = dlen ? snprintf(g_runtime, sizeof g_runtime, "%.*s/%s", (int)dlen, p, name)
                         : snprintf(g_runtime, sizeof g_runtime, "./%s", name);
            if (w > 0 && (size_t)w < sizeof g_runtime && access(g_runtime, X_OK) == 0 &&
                !(stat(g_runtime, &st) == 0 && S_ISDIR(st.st_mode)))
                found = 1;
            if (!colon)
                break;
            p = colon + 1;
        }
        if (!found)
            return 0;
    }
    if (access(g_runtime, X_OK) != 0 || !realpath(g_runtime, real))
        return 0;
    if (realpath("/proc/self/exe", me) && strcmp(me, real) == 0)
        return 0;
    if (realpath(OGH_SCRIPT, script) && strcmp(script, real) == 0)
        return 0;
    /* resolve_runtime's code_problem: the runtime is code run with this process's privilege, so it passes the
     * trust rule or Python decides (and refuses it with one line); a relative path is walked from the cwd */
    if (g_runtime[0] != '/') {
        char here[PATH_MAX], whole[2 * PATH_MAX];
        if (!getcwd(here, sizeof here) || snprintf(whole, sizeof whole, "%s/%s", here, g_runtime) >= PATH_MAX)
            return 0;
        return trusted(whole, 1);
    }
    return trusted(g_runtime, 1);
}

static void exec_runtime(void)
{
    exec_path(g_runtime); /* argv[0] is the runtime even when this front was started with no argv at all (argc 0) */
}

/* a value both runtimes take as it stands: not empty and no option (runc's flag package and crun's getopt both
 * take "--bundle -x" as the bundle "-x", but no runtime caller writes that) */
static int plain_value(const char *v)
{
    return v && v[0] && v[0] != '-';
}

/* g_argv[*i] is one of ``options`` ("NAME" a flag, "NAME=" an option with a value), spelled --NAME, --NAME=V,
 * --NAME V, or -N / -N V for a one-letter NAME: the option (with *i past it and its value in *value), else NULL */
static const char *common_option(int *i, const char *const *options, const char **value)
{
    const char *arg = g_argv[*i];
    for (int k = 0; options[k]; k++) {
        size_t len = strlen(options[k]);
        int takes = options[k][len - 1] == '=';
        const char *v = NULL;
        size_t name_len = len - (size_t)takes;
        if (name_len == 1 && arg[0] == '-' && arg[1] == options[k][0] && !arg[2])
            ; /* -N */
        else if (strncmp(arg, "--", 2) == 0 && strncmp(arg + 2, options[k], name_len) == 0 &&
                 (arg[2 + name_len] == '\0' || arg[2 + name_len] == '='))
            v = arg[2 + name_len] == '=' ? arg + 3 + name_len : NULL;
        else
            continue;
        if (!takes) {
            if (v)
                return NULL; /* --flag=VALUE: runc reads a bool, crun refuses */
            *value = NULL;
            (*i)++;
            return options[k];
        }
        if (!v) {
            if (*i + 1 >= g_argc)
                return NULL;
            v = g_argv[++*i];
        }
        if (!plain_value(v))
            return NULL;
        *value = v;
        (*i)++;
        return options[k];
    }
    return NULL;
}

/* The config.json that the runtime opens for this create/run, when the command line has the form that podman
 * (conmon), containerd and Docker write and that runc 1.1 (urfave/cli over Go's flag package) and crun 1.8
 * (glibc argp) read alike; else NULL, and Python reads the command line with the rules of the real runtime
 * (oci_argv.parse_argv, oci_argv.config_path).  The form:
 *
 *   [GLOBAL...] create|run [OPTION...] ID
 *   GLOBAL  --root V, --log V, --log-format text|json (each also --NAME=V), --debug, --systemd-cgroup
 *   OPTION  --bundle V, -b V, --bundle=V (one of them, once), --pid-file V, --console-socket V (also --NAME=V),
 *           --no-pivot, --no-new-keyring, --preserve-fds N; for run also --detach, -d
 *
 * where no V is empty or starts with '-', N is a decimal number, and ID is the last argument, not empty and no
 * option.  Both runtimes then open BUNDLE/config.json, BUNDLE being the working directory when not named. */
static const char *common_config_path(char *path, size_t size)
{
    static const char *const globals[] = {"root=", "log=", "log-format=", "debug", "systemd-cgroup", NULL};
    static const char *const create_options[] = {"bundle=", "b=", "pid-file=", "console-socket=", "no-pivot",
                                                 "no-new-keyring", "preserve-fds=", NULL};
    static const char *const run_options[] = {"bundle=", "b=", "pid-file=", "console-socket=", "no-pivot",
                                              "no-new-keyring", "preserve-fds=", "detach", "d", NULL};
    const char *bundle = NULL, *value, *option, *id;
    int i = 1, run;
    while (i < g_argc && g_argv[i][0] == '-') {
        if (!(option = common_option(&i, globals, &value)))
            return NULL;
        if (strcmp(option, "log-format=") == 0 && strcmp(value, "text") != 0 && strcmp(value, "json") != 0)
            return NULL;
    }
    if (i >= g_argc || !in_list(g_argv[i], OGH_REWRITE_COMMANDS))
        return NULL;
    run = strcmp(g_argv[i++], "run") == 0;
    while (i < g_argc - 1) {
        if (!(option = common_option(&i, run ? run_options : create_options, &value)))
            return NULL;
        if (strcmp(option, "bundle=") == 0 || strcmp(option, "b=") == 0) {
            if (bundle)
                return NULL; /* runc refuses some pairs ("Cannot use two forms of the same flag") */
            bundle = value;
        } else if (strcmp(option, "preserve-fds=") == 0) {
            size_t len = strlen(value);
            if (len > 9 || strspn(value, "0123456789") != len || (value[0] == '0' && len > 1))
                return NULL;
        }
    }
    if (i != g_argc - 1)
        return NULL;
    id = g_argv[i];
    if (!id[0] || id[0] == '-')
        return NULL;
    note_container(id, strlen(id));
    if (!bundle)
        bundle = ".";
    if ((size_t)snprintf(path, size, "%s%sconfig.json", bundle, bundle[strlen(bundle) - 1] == '/' ? "" : "/") >=
        size)
        return NULL;
    return path;
}

int main(int argc, char **argv)
{
    int as_baked, rewrite = 0, common;
    const char *name;
    char path[PATH_MAX];
    g_argc = argc;
    g_argv = argv;
    as_baked = settings_as_baked();
    for (int i = 1; i < argc; i++)
        if (in_list(argv[i], OGH_REWRITE_COMMANDS))
            rewrite = 1;
    name = getenv(OGH_RUNTIME_ENV);
    if (!name || !name[0])
        name = as_baked ? OGH_RUNTIME : NULL;
    if (!rewrite) {
        /* pass-through: the config file is not parsed here; the runtime named in it is used while the file
         * holds the bytes baked, else Python decides (it falls back to runc when the file is broken) */
        if (!name || !find_runtime(name)) {
            const char *what = "";
            /* Python cannot be trusted here: the runtime of the install still gets the command */
            if (untrusted(&what) && find_runtime(OGH_RUNTIME))
                exec_runtime();
            to_python(NULL, 0, 0);
        }
        if (argc == 2 && in_list(argv[1], OGH_VERSION_ARGS)) {
            dprintf(1, "%s\n", OGH_VERSION_LINE);
        }
        exec_runtime();
    }
    common = common_config_path(path, sizeof path) != NULL; /* argv alone (it names the container for the journal) */
    if (as_baked && config_still_trusted() && find_runtime(name) && common && file_clean(path))
        exec_runtime();
    ask_planner(NULL, 0);
    to_python(NULL, 0, 0);
    return 1;
}
#endif

