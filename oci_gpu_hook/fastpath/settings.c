/* oci-gpu-hook native front, the settings as baked: a part of front.c, which #includes it (one compile; not built alone).
 *
 * Mirrors: oci_gpu_hook/config.py load_config (env values: check_value of the bool fields), the launcher's
 * os.environ.setdefault of the baked defaults, oci_gpu_hook/fastpath/build.py baked_settings (the config bytes baked).
 */

/* ------------------------------------------------------------------ settings */

/* 1 when ``word`` is one of ``list`` (a NULL-terminated list), compared exactly */
static int in_list(const char *word, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (strcmp(word, list[i]) == 0)
            return 1;
    return 0;
}

/* a value config.check_value takes for a bool field from the environment: one of OGH_BOOL_WORDS in any case */
static int bool_ok(const char *v)
{
    for (int i = 0; OGH_BOOL_WORDS[i]; i++)
        if (strcasecmp(v, OGH_BOOL_WORDS[i]) == 0)
            return 1;
    return 0;
}

/* The config file is the one baked: byte for byte the same (none when none was baked). */
static int config_as_baked(int named)
{
    char *buf;
    size_t len;
    struct stat st;
    int same, fd;
    if (stat(OGH_CONFIG_PATH, &st) != 0) /* as Python: a missing default file is no file; a named one, an error */
        return !OGH_CONFIG_EXISTS && errno == ENOENT && !named;
    if ((fd = open_regular(OGH_CONFIG_PATH)) < 0)
        return 0;
    if (!OGH_CONFIG_EXISTS) {
        close(fd);
        return 0;
    }
    same = read_all(fd, &buf, &len);
    close(fd);
    if (!same)
        return 0;
    same = len == (size_t)OGH_CONFIG_LEN && memcmp(buf, OGH_CONFIG_BYTES, len) == 0;
    free(buf);
    return same;
}

/* The baked defaults, as the Python launcher's os.environ.setdefault; then 1 when the settings are
 * still the ones baked in: the same config file, unchanged, and no OCI_GPU_HOOK_* value that Python
 * would reject (only the bool variables have values to reject; the others are paths and strings).
 * Whether the file is still trusted is asked apart (config_still_trusted): a pass-through command needs
 * only the runtime, which is the baked one while the bytes are.
 * (Values that only narrow what is granted, or say where to log, do not matter to a container that asks
 * for nothing: Python logs no line for it.) */
static int settings_as_baked(void)
{
    const char *path, *v;
    for (int i = 0; OGH_DEFAULTS[i]; i += 2)
        setenv(OGH_DEFAULTS[i], OGH_DEFAULTS[i + 1], 0);
    if (!OGH_FAST_PATH_BAKED) {
        g_python_reason = "this launcher was built without a fast path for its config";
        return 0;
    }
    for (int i = 0; OGH_BOOL_ENV[i]; i++) {
        v = getenv(OGH_BOOL_ENV[i]);
        if (v && !bool_ok(v))
            return 0;
    }
    path = getenv(OGH_CONFIG_ENV);
    if (path && !path[0])
        path = NULL;
    if (strcmp(path ? path : OGH_DEFAULT_CONFIG, OGH_CONFIG_PATH) != 0)
        return 0;
    if (!config_as_baked(path != NULL)) {
        g_python_reason = "the config file changed since this launcher was built";
        return 0;
    }
    return 1;
}

/* config.check_trusted still passes for the config file, there or not (load_config walks an absent one too: a
 * directory given away, a pinned file gone): else Python refuses it */
static int config_still_trusted(void)
{
    return trusted(OGH_CONFIG_PATH, 0);
}

