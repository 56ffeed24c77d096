#!/usr/bin/env python3
"""The include allow-list (docs/architecture.md, "Layers").

Every source file belongs to one module (MODULES, first match wins); a
module may include its own headers, the modules and exact headers ALLOWED
lists for it, the third-party libraries LIBRARIES lists for it, and system
and standard headers. Anything else fails: a new edge needs a line here
(and in docs/architecture.md), so no dependency appears by accident.

  scripts/layering.py          # prints every include that breaks the list
                               # (and a docs/architecture.md table that differs)
  scripts/layering.py --table  # the allow-list as a Markdown table

Exit 1 when an include breaks the list. tests/ and bench/ may include any
module (they test and measure them); they still may not include a library
the list does not know.
"""
import os
import re
import sys

# (module, path regex): the first that matches a file's path names its module.
MODULES = [
    ("common/base", r"^common/[^/]+$"),
    ("common/wire", r"^common/wire/"),
    ("common/config", r"^common/config/"),
    ("common/rpc", r"^common/rpc/"),
    ("common/security", r"^common/security/"),
    ("kernels", r"^kernels/"),
    ("proto", r"^recps/v1/"),
    # The checkpoint's store side (writes a store's rows, imports them); the
    # rest of server/checkpoint is the file format the coordinator and
    # recpsctl link alone.
    ("server/checkpoint/store", r"^server/checkpoint/(checkpoint|store_rows)\.(h|cc)$"),
    ("server/checkpoint", r"^server/checkpoint/"),
    # Where rows live (host, device, layered): no request handling.
    ("server/store", r"^server/store/"),
    # A whole shard server as one object (store, services, gRPC server,
    # registration with the coordinator through the client library) and its
    # in-process endpoint: the composition root of recps-shard and of a
    # worker's embedded shard, as worker/main is for recps-worker.
    ("server/shard/process", r"^server/shard/(shard_process|in_process_shard|shard_main)\.(h|cc)$"),
    ("server/shard", r"^server/shard/"),
    ("server/coordinator", r"^server/coordinator/"),
    ("server/planner", r"^server/planner/"),
    ("client/admin", r"^client/admin/"),
    ("client/launcher", r"^client/launcher/"),
    ("client", r"^client/[^/]+$"),
    # recps-worker's own files: they compose the embedded shard server.
    ("worker/main", r"^worker/(worker_main\.cc|embedded_shard\.(h|cc))$"),
    ("worker", r"^worker/"),
    ("tests", r"^tests/"),
    ("bench", r"^bench/"),
]

# module -> the modules (or exact headers) it may include besides its own.
ALLOWED = {
    "common/base": [],
    "kernels": ["common/base"],
    "common/wire": ["common/base", "proto"],
    "common/config": ["common/base", "kernels", "proto"],
    "common/rpc": ["common/base", "common/wire", "proto"],
    "common/security": ["common/base"],
    "proto": [],
    "server/checkpoint": ["common/base", "common/wire", "proto"],
    "server/store": ["common/base", "common/wire", "common/config", "kernels"],
    "server/checkpoint/store": ["server/checkpoint", "server/store/embedding_store.h",
                                "common/base", "common/wire", "common/config",
                                "kernels", "proto"],
    "server/shard": ["common/base", "common/wire", "common/config", "common/rpc",
                     "kernels", "proto", "server/store", "server/checkpoint",
                     "server/checkpoint/store"],
    "server/shard/process": ["server/shard", "server/store", "client", "common/base",
                             "common/config", "common/rpc", "proto"],
    "server/coordinator": ["common/base", "common/wire", "common/config", "common/rpc",
                           "proto", "server/checkpoint", "server/planner"],
    "server/planner": ["common/base", "common/wire", "common/config", "proto",
                       "server/store/store_footprint.h"],
    "client": ["common/base", "common/wire", "common/rpc", "proto"],
    "client/admin": ["client", "common/base", "common/wire", "common/config",
                     "common/rpc", "common/security", "proto", "server/checkpoint",
                     "server/planner"],
    "client/launcher": ["common/base", "common/config", "common/rpc",
                        "common/security", "proto"],
    "worker": ["client", "common/base", "common/wire", "common/config",
               "common/rpc", "kernels", "proto"],
    "worker/main": ["worker", "client", "common/base", "common/wire",
                    "common/config", "common/rpc", "kernels", "proto",
                    "server/shard/shard_process.h"],
    "tests": "*",
    "bench": "*",
}

# Third-party headers: (path regex, library).
LIBRARY_HEADERS = [
    (r"^absl/", "absl"),
    (r"^google/protobuf/", "protobuf"),
    (r"^grpcpp?/", "grpc"),
    (r"^prometheus/", "prometheus"),
    (r"^rocksdb/", "rocksdb"),
    (r"^gloo/", "gloo"),
    (r"^openssl/", "openssl"),
    (r"^(cuda_runtime\.h|cuda\.h|cublas_v2\.h|cublasLt\.h|cub/|nccl\.h|cuda_fp16\.h|cuda_bf16\.h)", "cuda"),
    (r"^cblas\.h$", "blas"),
    (r"^benchmark/", "benchmark"),
    (r"^(gtest|gmock)/|^fuzzer/", "test"),
]

# module -> the libraries it may include.
LIBRARIES = {
    "common/base": ["absl"],
    "kernels": ["absl", "cuda", "blas"],
    "common/wire": ["absl", "protobuf"],
    "common/config": ["absl", "protobuf"],
    "common/rpc": ["absl", "protobuf", "grpc", "prometheus", "openssl"],
    "common/security": ["absl"],
    "proto": ["protobuf", "grpc"],
    "server/checkpoint": ["absl", "protobuf", "rocksdb"],
    "server/checkpoint/store": ["absl", "protobuf", "rocksdb"],
    "server/store": ["absl", "cuda"],
    "server/shard": ["absl", "protobuf", "grpc", "prometheus"],
    "server/shard/process": ["absl", "protobuf", "grpc", "prometheus"],
    "server/coordinator": ["absl", "protobuf", "grpc", "prometheus", "rocksdb"],
    "server/planner": ["absl", "protobuf"],
    "client": ["absl", "protobuf", "grpc"],
    "client/admin": ["absl", "protobuf", "grpc"],
    "client/launcher": ["absl", "protobuf", "grpc"],
    "worker": ["absl", "protobuf", "grpc", "prometheus", "gloo", "cuda"],
    "worker/main": ["absl", "protobuf", "grpc", "prometheus", "gloo", "cuda"],
    "tests": "*",
    "bench": "*",
}

SOURCE_ROOTS = ["common", "kernels", "server", "client", "worker", "tests", "bench"]
PROJECT_ROOTS = set(SOURCE_ROOTS) | {"recps"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def module_of(path):
    for name, pattern in MODULES:
        if re.search(pattern, path):
            return name
    return None


def library_of(header):
    for pattern, lib in LIBRARY_HEADERS:
        if re.search(pattern, header):
            return lib
    return None  # a system or standard header


def check(root):
    broken = []
    for top in SOURCE_ROOTS:
        for folder, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.relpath(os.path.join(folder, f), root)
                module = module_of(path)
                if module is None:
                    broken.append(f"{path}: in no module of scripts/layering.py MODULES")
                    continue
                with open(os.path.join(root, path), errors="replace") as source:
                    for number, line in enumerate(source, 1):
                        m = INCLUDE.match(line)
                        if m:
                            why = refused(module, m.group(1))
                            if why:
                                broken.append(f"{path}:{number}: {why}")
    return broken


def refused(module, header):
    """Why `module` may not include `header`, or None."""
    if header.split("/")[0] in PROJECT_ROOTS and "/" in header:
        target = module_of(header)
        if target is None or target == module:
            return None
        allowed = ALLOWED[module]
        if allowed == "*" or target in allowed or header in allowed:
            return None
        return (f"{module} may not include {header} ({target}); "
                f"it may include {', '.join(allowed) or 'nothing of the project'}")
    lib = library_of(header)
    if lib is None or LIBRARIES[module] == "*" or lib in LIBRARIES[module]:
        return None
    return f"{module} may not include {header} (library {lib}); it may use {', '.join(LIBRARIES[module])}"


def table():
    rows = ["| module | files | may include | libraries |", "| --- | --- | --- | --- |"]
    for name, pattern in MODULES:
        allowed = ALLOWED[name]
        libs = LIBRARIES[name]
        pattern = pattern.replace("|", "\\|")  # a Markdown table cell
        rows.append(f"| `{name}` | `{pattern}` | "
                    f"{'any module' if allowed == '*' else ', '.join(f'`{a}`' for a in allowed) or '-'} | "
                    f"{'any' if libs == '*' else ', '.join(libs)} |")
    return "\n".join(rows)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--table" in sys.argv[1:]:
        print(table())
        return 0
    broken = check(root)
    # docs/architecture.md shows the same table: a new edge updates both.
    with open(os.path.join(root, "docs", "architecture.md")) as doc:
        if table() not in doc.read():
            broken.append("docs/architecture.md's module table differs from this list: "
                          "paste `scripts/layering.py --table` there")
    for b in broken:
        print("layering:", b)
    if broken:
        print(f"layering: {len(broken)} problem(s) with the allow-list (scripts/layering.py)")
        return 1
    print("layering: every include is on the allow-list")
    return 0


if __name__ == "__main__":
    sys.exit(main())
