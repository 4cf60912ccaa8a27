"""OCI input read exactly as runc reads it: config.json (spec), the runtime's argv (argv), the state JSON (state)."""
