"""math-verify in a helper process (started by ``math_equiv``, never imported by the host).

sympy can hold the GIL for minutes or eat gigabytes on a few characters (``9^{9^{9}}``,
``100000000!``, an integral), and a thread cannot be killed: running it here lets the host
kill this process at a hard deadline. Protocol: one JSON line per request on stdin
``{"pred", "gold", "timeout"}``, one per reply on stdout ``{"equal", "reason"}``; the first line
out is ``{"ready": true}``. Exits when stdin closes (the host went away).
"""

import json
import logging
import resource
import sys

MEMORY_BYTES = 4 << 30  # an exploding expression fails with MemoryError instead of swapping the host


class _TimeoutFlag(logging.Handler):
    """math-verify reports its (signal.alarm) timeouts only as log warnings: remember them."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hit = False

    def emit(self, record):
        if record.getMessage().startswith("Timeout"):
            self.hit = True


def _reply(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve() -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ValueError, OSError):
        pass
    from math_verify import parse, verify

    flag = _TimeoutFlag()
    logger = logging.getLogger("math_verify")
    logger.addHandler(flag)
    logger.propagate = False  # keep its warnings off the host's stderr
    _reply({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        timeout = request["timeout"]
        flag.hit = False
        try:
            gold = parse("\\boxed{" + request["gold"] + "}", parsing_timeout=timeout)
            pred = parse("\\boxed{" + request["pred"] + "}", parsing_timeout=timeout)
            if not gold or not pred:
                equal, reason = False, "timeout" if flag.hit else "unparsed"
            else:
                equal = bool(verify(gold, pred, timeout_seconds=timeout))
                reason = "equal" if equal else ("timeout" if flag.hit else "not_equal")
        except BaseException as exc:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
            equal, reason = False, f"error: {type(exc).__name__}"
        _reply({"equal": equal, "reason": reason})


if __name__ == "__main__":
    sys.path.pop(0)  # this file's directory: its siblings must not shadow real modules
    serve()
