"""What the deploy tests share: reporting, child environments, waiting, the
built binaries. Each test script sets `testlib.SRC` and `testlib.BUILD` first."""

import os
import sys
import time

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests
MIN_AUC = 0.75
SRC = BUILD = None  # the source and CMake build directories, set by the test's main()
failures = []
partly_skipped = []  # parts of a check left out for a missing tool (then exit 77)


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg, flush=True)


def info(msg):
    print(msg, flush=True)


def skip(msg):
    info("SKIPPED: " + msg)
    sys.exit(SKIP)


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def clean_env():
    """This environment without what would change a rank or a node's role."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("SLURM_", "RANK", "LOCAL_", "WORLD_SIZE", "GROUP_RANK",
                         "JOB_COMPLETION_INDEX", "CUDA_VISIBLE_DEVICES", "RECPS_")):
            del env[k]
    return env


def wait_for(what, predicate, timeout, alive=()):
    """predicate()'s first true value; raises when `timeout` passes or one of
    the (name, Popen) in `alive` exits first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = predicate()
        if v:
            return v
        for name, p in alive:
            if p.poll() is not None:
                raise RuntimeError("%s exited (code %s) while waiting for %s" % (name, p.returncode, what))
        time.sleep(0.05)
    raise RuntimeError("timed out after %ss waiting for %s" % (timeout, what))


def binary(name):
    path = os.path.join(BUILD, "bin", name)
    if not os.access(path, os.X_OK):
        raise RuntimeError("%s is not built (cmake --build %s --target %s)" % (path, BUILD, name))
    return path
