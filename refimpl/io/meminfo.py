"""MemAvailable, in a module of its own: the CLI asks it before anything heavy is imported
(refimpl/cli/compile_ahead.py); the streamer's budgets and ``--pack auto`` ask it too (refimpl.io.streamer)."""


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
