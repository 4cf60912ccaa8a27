"""The operator commands, one module each, each with ``run(args, config)``; the one table of commands is
:data:`oci_gpu_hook.entry.cli.COMMANDS`.  None of them is on a container's start path."""
