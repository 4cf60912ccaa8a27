"""``oci-gpu-hook install``: put everything a host needs in place, record it, and take it back out.

``install [--only podman,docker,containerd,crio,cdi,systemd,nri]``: each integration on its own; one
that cannot be done (a config install cannot read, a containerd config of version 1) is reported and
skipped, and the others are still done.  Without ``--only``: the launchers, the podman hook and the
CDI specs always, and docker, containerd, CRI-O and systemd where their ``/etc`` directory exists.
What it writes (real paths; ``--prefix DIR`` puts each of them under DIR, creating what it needs):

- the lean launchers ``oci-gpu-hook`` and ``oci-gpu-runtime`` in :data:`paths.LAUNCHER_DIR` (mode 0755);
- podman: the hooks.d file of the chosen stage (``--hook precreate|prestart|none``) in the hooks
  directory this podman reads (:mod:`podman`: containers.conf ``[engine] hooks_dir``, else
  podman's default ``/usr/share/containers/oci/hooks.d``), ``hook.path`` the installed launcher;
- cdi: the CDI spec of each kind with devices in ``cdi_dir`` (``<vendor>-<class>.json``);
- docker: the ``oci-gpu`` runtime merged into ``/etc/docker/daemon.json`` (``--docker-default-runtime``:
  also ``"default-runtime": "oci-gpu"``), and the ``amd-container-runtime`` name Docker 28.3+'s
  ``--gpus`` looks for on dockerd's PATH, unless someone else's is there (:mod:`docker`);
- containerd: the drop-in at :data:`containerd.DROP_IN_PATH` (config version 2, 3 or 4; native CDI on
  1.7+) and the main config with the ``imports`` line that loads it (:mod:`containerd`); which
  containerd the node runs is read under ``--host-root`` or given as ``--containerd-version``
  (:mod:`containerd_detect`);
- crio: the drop-in :data:`crio.DROP_IN_PATH` (CDI spec dirs, the ``oci-gpu`` runtime handler);
- systemd: the ``watch`` unit in :data:`paths.SYSTEMD_UNIT` and the resident planner's (``serve``) in
  :data:`paths.PLANNER_UNIT`, their ExecStart the installed launcher;
- the manifest :data:`paths.MANIFEST_PATH`: each file written (its sha256 and mode, its integration, and
  what was there before), and each directory created.

A file that was already there with other content (or a symlink) is first saved under
:data:`paths.BACKUP_DIR`, and put back by ``--uninstall``; one already exactly as wanted is adopted and left
in place by ``--uninstall``.  ``--prefix`` changes where files land, never what they say.

Running install again is idempotent.  A file install wrote that has been edited since is never
overwritten.  Uninstall is whole or says why not: an edited file keeps what it names (the launchers, the
containerd drop-in), and uninstall then exits 1 with a ``left:`` line for each file, keeping the manifest and
backups for the next run (:mod:`installer` has the rule).

**Crash safety.**  Every run is one transaction recorded in a journal
(:data:`paths.JOURNAL_PATH`, written atomically and fsync'd) *before* each change: a directory
made or removed, or a path about to change, with a copy of what was there.  The run ends by deleting
the journal.  A run killed at any point leaves the journal behind; the next run (install or
uninstall) first rolls the interrupted one back, step by step in reverse (each undo idempotent, so
a rollback killed half-way is simply done again), and then does its own work.  The state directory
is created (and removed by uninstall) with a single rename from a staging directory, so even those
moments leave nothing behind.  Tests kill a run at every one of its steps with
``OCI_GPU_HOOK_INSTALL_KILL_AT=N`` (SIGKILL just before the Nth change).

The modules, one concern each: :mod:`paths` (where), :mod:`items` (what: one item per file, per
integration), :mod:`manifest` (what is installed), :mod:`journal` (each run one transaction; every change
one step, every file through :mod:`oci_gpu_hook.atomic`), :mod:`installer` (install and uninstall,
file by file), :mod:`run` (one run: the checks before and after, the lock); its command line is
:mod:`oci_gpu_hook.entry.commands.install`.
"""
