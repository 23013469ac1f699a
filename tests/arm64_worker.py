"""The aarch64 side of tests/arm64.py: read ``(fn, args)`` pickles from stdin, answer ``(ok, result or error)``.

Runs under ``qemu-aarch64`` in Debian's arm64 python3.11 with numpy 1.24, ``LLAMA_CPP_LIB_PATH`` naming the ARM
build's libraries (tests/ggml_graph.py loads them from there).
"""

from __future__ import annotations

import io
import pickle
import sys
import traceback

from arm64 import receive, reduce_numpy, send


class Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        return reduce_numpy(obj)


def main() -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # prints of the called code must not reach the pipe
    while True:
        request = receive(stdin)
        if request is None:
            return 0
        try:
            fn, args = pickle.loads(request)
            result = (True, fn(*args))
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            result = (False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")
        buf = io.BytesIO()
        try:
            Pickler(buf, protocol=4).dump(result)
        except Exception as e:  # noqa: BLE001
            buf = io.BytesIO()
            Pickler(buf, protocol=4).dump((False, f"unpicklable result: {e}"))
        send(stdout, buf.getvalue())


if __name__ == "__main__":
    sys.exit(main())
