"""The one error type every entry point turns into a single line on stderr."""


class HookError(Exception):
    """A failure with a message fit for an operator: what was wrong and what is valid.

    Entry points print ``str(err)`` on one line and exit non-zero; no traceback
    unless debugging is on.  ``container_id``, when known, goes into the log record.
    """

    container_id: str | None = None
