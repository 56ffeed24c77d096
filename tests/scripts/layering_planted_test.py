#!/usr/bin/env python3
"""The allow-list catches what it must: a copy of the tree's sources with one
planted include per kind of breach (a module including a module it may not,
a file in no module, a library a module may not use) makes
scripts/layering.py's check report each, and the real tree reports none.
"""
import importlib.util
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("layering", os.path.join(ROOT, "scripts", "layering.py"))
layering = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layering)

PLANTS = {
    # the store may not reach up into request handling or the client
    "server/store/planted_up.cc": ('#include "server/shard/shard_server.h"\n',
                                   "server/store may not include server/shard/shard_server.h"),
    "server/checkpoint/planted_store.cc": ('#include "server/store/host_table.h"\n',
                                           "server/checkpoint may not include server/store/host_table.h"),
    "kernels/planted_grpc.cc": ('#include <grpcpp/grpcpp.h>\n',
                                "kernels may not include grpcpp/grpcpp.h (library grpc)"),
    "client/planted_server.cc": ('#include "server/shard/shard_server.h"\n',
                                 "client may not include server/shard/shard_server.h"),
}


def main():
    failures = []
    clean = layering.check(ROOT)
    if clean:
        failures.append("the tree itself breaks the list:\n  " + "\n  ".join(clean))
    with tempfile.TemporaryDirectory() as tmp:
        for top in layering.SOURCE_ROOTS:
            src = os.path.join(ROOT, top)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(tmp, top),
                                ignore=shutil.ignore_patterns("*.py*", "*.md", "*.txt"))
        for path, (line, _) in PLANTS.items():
            with open(os.path.join(tmp, path), "w") as f:
                f.write(line)
        broken = layering.check(tmp)
        for path, (_, want) in PLANTS.items():
            if not any(b.startswith(path + ":") and want in b for b in broken):
                failures.append(f"planted {path} was not reported as '{want}'")
        if len(broken) != len(PLANTS):
            failures.append(f"expected {len(PLANTS)} reports, got {len(broken)}:\n  " +
                            "\n  ".join(broken))
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"layering: {len(PLANTS)} planted includes reported, the tree clean")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
