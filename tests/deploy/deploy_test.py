#!/usr/bin/python3
"""Tests of deploy/: the container image recipe, the Kubernetes manifests,
the monitoring configs and the SLURM script, checked against the real
binaries.

  deploy_test.py CHECK SOURCE_DIR BUILD_DIR

CHECK is one of: image, manifests, k8s_local, monitoring, metrics, slurm
(see the functions of the same names). Tools come from tests/deploy/setup.sh;
a check whose tool cannot be had exits 77 (ctest: skipped) saying which.
Every process a check starts is stopped when it ends, however it ends.
"""

import atexit
import glob
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import testlib
from testlib import (MIN_AUC, SKIP, binary, clean_env, fail, failures, info,
                     skip, tail, wait_for)

BINARIES = ["recps", "recps-shard", "recps-coordinator", "recps-worker", "recpsctl"]
OVERLAYS = ["cpu", "gpu", "large", "monitoring"]
IMAGE_BIN_DIR = "/opt/recps/bin"  # where the Dockerfile puts the binaries
K8S_VERSION = "1.33.0"  # the Kubernetes API rendered objects are checked against
# The worker metrics another change renames (recps_worker{quantity=...}
# gauges today). Until it lands, their absence is reported, not a failure.
WORKER_RENAMED = {
    "recps_worker_samples_per_second", "recps_worker_step_seconds",
    "recps_worker_loss", "recps_worker_eval_auc", "recps_worker_steps_total",
}

SRC = BUILD = None
partly_skipped = []  # parts of a check left out for a missing tool



def k8s_quantity(q):
    """A Kubernetes quantity ("2Gi", "500M", "1", "250m") in plain units, rounded up."""
    q = str(q)
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
                "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 1e-3}
    for suffix, scale in sorted(suffixes.items(), key=lambda kv: -len(kv[0])):
        if q.endswith(suffix):
            return int(-(-float(q[:-len(suffix)]) * scale // 1))
    return int(-(-float(q) // 1))

# ---------------------------------------------------------------- processes

class Processes:
    """Children in their own sessions; all stopped at exit or on a signal."""

    def __init__(self):
        self.procs = []  # (name, Popen, log path)
        atexit.register(self.stop_all)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        self.stop_all()
        sys.exit(128 + signum)

    def start(self, name, argv, env, log, cwd=None):
        out = open(log, "wb")
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
        out.close()
        self.procs.append((name, p, log))
        return p

    def stop(self, p, grace=10.0):
        if p.poll() is not None:
            return p.returncode
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return p.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return p.wait()

    def stop_all(self):
        for _, p, _ in reversed(self.procs):
            if p.poll() is None:
                self.stop(p, grace=5.0)
            else:
                # The process is gone; anything it left in its group is not.
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(n):
    """n consecutive free ports (the SLURM script numbers ports base + i)."""
    for _ in range(200):
        base = free_port()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no %d consecutive free ports" % n)


def session_members(sid):
    """Pids of the processes still in session `sid` (from /proc)."""
    pids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # state ppid pgrp session ...
            pids.append(int(stat.split("/")[2]))
    return pids


# -------------------------------------------------------------------- tools

def load_tools():
    setup = os.path.join(SRC, "tests/deploy/setup.sh")
    r = subprocess.run([setup, BUILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tools = {}
    path = os.path.join(BUILD, "deploy-tools/tools.env")
    if r.returncode != 0 or not os.path.exists(path):
        info(r.stdout)
        skip("tests/deploy/setup.sh failed")
    for line in open(path):
        k, _, v = line.strip().partition("=")
        tools[k] = v.strip("'")
    return tools


def need_yaml(tools):
    """Re-runs this check under the venv's Python (PyYAML) when not there yet."""
    try:
        import yaml  # noqa: F401
        return
    except ImportError:
        pass
    py = tools.get("VENV_PYTHON")
    if not py:
        skip("PyYAML unavailable: " + tools.get("VENV_WHY", ""))
    os.execv(py, [py] + sys.argv)


_flags_cache = {}


def known_flags(name):
    """The flags a binary defines, from its --helpfull."""
    if name not in _flags_cache:
        r = subprocess.run([binary(name), "--helpfull"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        _flags_cache[name] = set(re.findall(r"^\s+--([a-z0-9_]+) \(", r.stdout, re.M))
        if not _flags_cache[name]:
            raise RuntimeError("no flags in %s --helpfull" % name)
    return _flags_cache[name]


# ------------------------------------------------------------------- render

def render(kubectl, overlay):
    import yaml
    path = os.path.join(SRC, "deploy/k8s", overlay)
    r = subprocess.run([kubectl, "kustomize", path], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s kustomize %s failed:\n%s" % (kubectl, path, r.stderr))
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def pod_templates(objs):
    for o in objs:
        if o["kind"] in ("StatefulSet", "Job", "Deployment"):
            yield o, o["spec"]["template"]


def flag_value(args, name):
    for a in args:
        if a.startswith("--" + name + "="):
            return a.split("=", 1)[1]
    return None


def split_launch_args(args):
    """recps launch args -> (launcher flags normalised to '_', worker flags)."""
    if "--" in args:
        i = args.index("--")
        own, worker = args[:i], args[i + 1:]
    else:
        own, worker = args, []
    norm = []
    for a in own:
        if a.startswith("--"):
            k, eq, v = a[2:].partition("=")
            a = "--" + k.replace("-", "_") + eq + v
        norm.append(a)
    return norm, worker


def check_flags(where, name, args):
    known = known_flags(name)
    for a in args:
        if not a.startswith("--"):
            continue
        flag = a[2:].split("=", 1)[0]
        if flag.startswith("no") and flag[2:] in known:
            continue
        if flag not in known:
            fail("%s: %s does not know --%s" % (where, name, flag))


# ------------------------------------------------------------------- checks

def image():
    """The Dockerfile's sources exist and the runtime packages cover ldd."""
    dockerfile = os.path.join(SRC, "deploy/docker/Dockerfile")
    text = open(dockerfile).read()
    # Join continuation lines, drop comments.
    lines = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            lines.append(line.strip())
    stage = None
    build_stage_runs = []
    froms = []
    user = None
    for line in lines:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            froms.append(rest)
            stage = rest.split(" AS ")[-1].strip() if " AS " in rest else "final"
        elif word == "RUN" and stage == "build":
            build_stage_runs.append(rest)
        elif word == "USER":
            user = rest.split(":")[0]
        elif word == "COPY":
            parts = shlex.split(rest)
            flags = [p for p in parts if p.startswith("--")]
            srcs = [p for p in parts if not p.startswith("--")][:-1]
            if any(f.startswith("--from=") for f in flags):
                # From the build stage: /out/... must be made by its RUNs.
                for s in srcs:
                    if not any(s.rstrip("/") in r for r in build_stage_runs):
                        fail("COPY --from source %s is not produced by the build stage" % s)
                continue
            for s in srcs:
                if s == ".":
                    continue
                if not glob.glob(os.path.join(SRC, s)):
                    fail("COPY source %s does not exist in the repository" % s)
    if len(froms) < 2:
        fail("the Dockerfile is not multi-stage")
    if user is None or user in ("0", "root"):
        fail("the image does not switch to a non-root USER (got %s)" % user)
    runs = " ".join(build_stage_runs)
    for script in re.findall(r"((?:scripts|deploy)/[\w./-]+\.sh)", runs):
        if not os.access(os.path.join(SRC, script), os.X_OK):
            fail("the build stage runs %s, which is not an executable in the repository" % script)
    for b in BINARIES:
        if "build/bin/%s " % b not in runs + " ":
            fail("the build stage does not copy build/bin/%s" % b)
        binary(b)  # the build layout has it
    if "-DRECPS_CUDA=${CUDA}" not in runs:
        fail("the CUDA build argument does not reach scripts/build.sh")
    if ("COPY --from=build /out/bin/ %s/" % IMAGE_BIN_DIR) not in text:
        fail("the binaries are not copied to %s (the manifests run them from there)" % IMAGE_BIN_DIR)
    ignore = os.path.join(SRC, "deploy/docker/Dockerfile.dockerignore")
    for pat in open(ignore).read().split():
        if pat.startswith("#"):
            continue
        for needed in ("scripts", "examples", "deploy", "CMakeLists.txt"):
            if pat.strip("/") == needed:
                fail("Dockerfile.dockerignore excludes %s, which the build needs" % needed)

    # Runtime packages: what runtime-packages.sh derives must hold every
    # library ldd lists, and every package must be installable.
    bins = [binary(b) for b in BINARIES]
    r = subprocess.run([os.path.join(SRC, "deploy/docker/runtime-packages.sh")] + bins,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail("runtime-packages.sh failed: " + r.stderr)
    packages = set(r.stdout.split())
    info("runtime packages: " + " ".join(sorted(packages)))
    ldd = subprocess.run(["ldd"] + bins, stdout=subprocess.PIPE, text=True).stdout
    # CUDA toolkit libraries come with the CUDA variant's base image (see
    # runtime-packages.sh); the CPU image links none of them.
    libs = sorted(l for l in set(re.findall(r"=> (/\S+)", ldd))
                  if not l.startswith("/usr/local/cuda"))
    candidates = {lib: [lib, os.path.realpath(lib), "/usr" + lib, re.sub(r"^/usr", "", lib)]
                  for lib in libs}
    d = subprocess.run(["dpkg", "-S"] + sorted({p for c in candidates.values() for p in c}),
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    owner_of = {}  # path -> packages ("pkg[:arch][, pkg]: path")
    for line in d.splitlines():
        pk, _, path = line.partition(": /")
        owner_of["/" + path] = {x.strip().split(":")[0] for x in pk.split(",")}
    for lib in libs:
        owners = set().union(*(owner_of.get(p, set()) for p in candidates[lib]))
        if not owners & packages:
            fail("%s (package %s) is not among the runtime packages" % (lib, owners or "none"))
    info("%d libraries checked against %d packages" % (len(libs), len(packages)))
    if glob.glob("/var/lib/apt/lists/*Packages*"):
        shown = subprocess.run(["apt-cache", "show", "--no-all-versions"] + sorted(packages),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
        for p in sorted(packages - set(re.findall(r"^Package: (\S+)", shown, re.M))):
            fail("runtime package %s is unknown to apt" % p)
    else:
        info("apt lists absent: did not check that the packages exist in the archive")


def check_rendered(overlay, objs):
    """Static checks of one overlay's objects against the binaries."""
    where = lambda o: "%s: %s/%s" % (overlay, o["kind"], o["metadata"]["name"])  # noqa: E731
    stss = {o["metadata"]["name"]: o for o in by_kind(objs, "StatefulSet")}
    jobs = by_kind(objs, "Job")
    coord = stss.get("recps-coordinator")
    shard = stss.get("recps-shard")
    if coord is None or shard is None or len(jobs) != 1:
        fail("%s: expected StatefulSets recps-coordinator, recps-shard and one Job" % overlay)
        return
    job = jobs[0]
    c_args = coord["spec"]["template"]["spec"]["containers"][0]["args"]
    s_args = shard["spec"]["template"]["spec"]["containers"][0]["args"]
    w_args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    launch, worker_flags = split_launch_args(w_args)
    if coord["spec"]["replicas"] != 1:
        fail("%s: the coordinator must have 1 replica" % where(coord))
    if str(shard["spec"]["replicas"]) != flag_value(c_args, "num_shards"):
        fail("%s: coordinator --num_shards=%s but %s replicas" % (
            overlay, flag_value(c_args, "num_shards"), shard["spec"]["replicas"]))
    spec = job["spec"]
    if spec.get("completionMode") != "Indexed":
        fail("%s: the worker Job is not Indexed" % where(job))
    nnodes = int(flag_value(launch, "nnodes") or -1)
    nproc = int(flag_value(launch, "nproc_per_node") or 1)
    if not (spec.get("completions") == spec.get("parallelism") == nnodes):
        fail("%s: completions %s, parallelism %s and --nnodes %s must agree" % (
            where(job), spec.get("completions"), spec.get("parallelism"), nnodes))
    if int(flag_value(s_args, "world_size") or 1) != nnodes * nproc:
        fail("%s: shard --world_size=%s but %d workers (%d nodes x %d)" % (
            overlay, flag_value(s_args, "world_size"), nnodes * nproc, nnodes, nproc))
    if flag_value(launch, "node_rank") is not None:
        fail("%s: --node_rank is set; the rank must come from JOB_COMPLETION_INDEX" % where(job))
    if shard["spec"].get("podManagementPolicy") != "Parallel":
        fail("%s: shard servers must start in parallel (none is ready before all are)" % where(shard))
    headless = [s for s in by_kind(objs, "Service") if s["metadata"]["name"] == shard["spec"]["serviceName"]]
    if not headless or headless[0]["spec"].get("clusterIP") != "None" or \
            not headless[0]["spec"].get("publishNotReadyAddresses"):
        fail("%s: the shard Service must be headless and publish not-ready addresses" % overlay)
    if not any(p["spec"]["selector"]["matchLabels"] == shard["spec"]["selector"]["matchLabels"]
               for p in by_kind(objs, "PodDisruptionBudget")):
        fail("%s: no PodDisruptionBudget covers the shard servers" % overlay)
    if not any(v["metadata"]["name"] for v in coord["spec"].get("volumeClaimTemplates", [])):
        fail("%s: the coordinator has no PersistentVolumeClaim" % overlay)
    state_dir = flag_value(c_args, "state_dir") or ""
    mounts = coord["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    pvc_names = {v["metadata"]["name"] for v in coord["spec"]["volumeClaimTemplates"]}
    if not any(m["name"] in pvc_names and state_dir.startswith(m["mountPath"]) for m in mounts):
        fail("%s: --state_dir=%s is not on the coordinator's PVC" % (overlay, state_dir))
    if not shard["spec"].get("volumeClaimTemplates"):
        fail("%s: the shard servers have no PersistentVolumeClaim" % overlay)

    for o, tmpl in pod_templates(objs):
        pspec = tmpl["spec"]
        ann = tmpl["metadata"].get("annotations", {})
        if ann.get("prometheus.io/scrape") != "true":
            fail("%s: pods are not annotated prometheus.io/scrape" % where(o))
        psc = pspec.get("securityContext", {})
        if not psc.get("runAsNonRoot"):
            fail("%s: pods do not run as non-root" % where(o))
        volumes = {v["name"] for v in pspec.get("volumes", [])}
        volumes |= {v["metadata"]["name"] for v in o["spec"].get("volumeClaimTemplates", [])}
        for c in pspec["containers"]:
            csc = c.get("securityContext", {})
            if not csc.get("readOnlyRootFilesystem") or csc.get("allowPrivilegeEscalation") is not False:
                fail("%s: container %s needs readOnlyRootFilesystem and no privilege escalation"
                     % (where(o), c["name"]))
            res = c.get("resources", {})
            if not res.get("requests") or not res.get("limits"):
                fail("%s: container %s has no resource requests/limits" % (where(o), c["name"]))
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    fail("%s: volume %s is mounted but not defined" % (where(o), m["name"]))
            ports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
            if int(ann.get("prometheus.io/port", 0)) not in ports:
                fail("%s: prometheus.io/port %s is not a container port" % (where(o), ann.get("prometheus.io/port")))
            cmd = c["command"][0]
            if os.path.dirname(cmd) != IMAGE_BIN_DIR:
                fail("%s: command %s is not in the image's %s" % (where(o), cmd, IMAGE_BIN_DIR))
            name = os.path.basename(cmd)
            args = c.get("args", [])
            env_names = {e["name"] for e in c.get("env", [])}
            for ref in re.findall(r"\$\((\w+)\)", " ".join(args)):
                if ref not in env_names:
                    fail("%s: $(%s) is used but not in the container's env" % (where(o), ref))
            if name == "recps":
                own, wflags = split_launch_args(args)
                if own[:1] != ["launch"]:
                    fail("%s: the worker pods must run `recps launch`" % where(o))
                check_flags(where(o), "recps", own[1:])
                check_flags(where(o), "recps-worker", wflags)
                metrics = flag_value(wflags, "metrics_listen")
            else:
                check_flags(where(o), name, args)
                metrics = flag_value(args, "metrics_listen")
                listen = flag_value(args, "listen")
                lport = int(listen.rsplit(":", 1)[1]) if listen else None
                # With mutual TLS the kubelet's gRPC probe asks the plaintext
                # health-only port (--health_listen).
                health = flag_value(args, "health_listen")
                hport = int(health.rsplit(":", 1)[1]) if health else lport
                for probe in ("readinessProbe", "livenessProbe"):
                    pr = c.get(probe)
                    if not pr:
                        fail("%s: no %s" % (where(o), probe))
                        continue
                    port = (pr.get("grpc") or pr.get("tcpSocket") or {}).get("port")
                    want = hport if "grpc" in pr else lport
                    if port != want:
                        fail("%s: %s port %s is not the %s port %s" % (
                            where(o), probe, port, "--health_listen" if "grpc" in pr else "--listen", want))
                if "grpc" not in c.get("readinessProbe", {}):
                    fail("%s: the readiness probe is not a grpc probe" % where(o))
            # Thread counts follow the CPU limit (the binaries' default is
            # one per core of the node, which a container does not have).
            cpu = str(res.get("limits", {}).get("cpu", ""))
            cores = int(cpu[:-1]) // 1000 if cpu.endswith("m") else int(cpu or 0)
            env_values = {e["name"]: e.get("value") for e in c.get("env", [])}
            expected = {}
            if name == "recps":
                expected = {"--threads": flag_value(wflags, "threads"),
                            "OPENBLAS_NUM_THREADS": env_values.get("OPENBLAS_NUM_THREADS")}
            elif name == "recps-shard":
                expected = {"--threads": flag_value(args, "threads"),
                            "--store_threads": flag_value(args, "store_threads")}
            for what, v in expected.items():
                if v is None or int(v) != max(cores, 1):
                    fail("%s: %s=%s does not match the CPU limit %s" % (where(o), what, v, cpu))
            if metrics is None or int(metrics.rsplit(":", 1)[1]) != int(ann.get("prometheus.io/port", -1)):
                fail("%s: --metrics_listen=%s does not serve prometheus.io/port %s" % (
                    where(o), metrics, ann.get("prometheus.io/port")))
    if overlay == "gpu":
        res = job["spec"]["template"]["spec"]["containers"][0]["resources"]
        if str(res.get("limits", {}).get("nvidia.com/gpu")) != "1":
            fail("gpu: worker pods must ask for one nvidia.com/gpu")
        env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        if not any(n.startswith("NCCL_") for n in env):
            fail("gpu: no NCCL settings in the worker env")
    if overlay == "monitoring":
        sms = [o for o in objs if o["kind"] == "ServiceMonitor"]
        if not sms:
            fail("monitoring: no ServiceMonitor")
        for sm in sms:
            sel = sm["spec"]["selector"]["matchLabels"]
            svcs = [s for s in by_kind(objs, "Service")
                    if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
            for ep in sm["spec"]["endpoints"]:
                hit = [s for s in svcs if any(p.get("name") == ep["port"] for p in s["spec"]["ports"])]
                comps = {s["spec"]["selector"]["app.kubernetes.io/name"] for s in hit}
                if comps != {"recps-coordinator", "recps-shard", "recps-worker"}:
                    fail("monitoring: ServiceMonitor port %s reaches %s, not all three components"
                         % (ep["port"], sorted(comps)))


def manifests():
    """Every overlay renders with every kubectl, validates, lints and agrees
    with the binaries' flags."""
    tools = load_tools()
    need_yaml(tools)
    import yaml
    kubectls = tools["KUBECTLS"].split()
    if not kubectls:
        skip(tools["KUBECTL_WHY"])
    for copy, orig in (("deploy/k8s/base/small.textproto", "examples/small.textproto"),
                       ("deploy/k8s/overlays/large/criteo.textproto", "examples/criteo.textproto")):
        if open(os.path.join(SRC, copy)).read() != open(os.path.join(SRC, orig)).read():
            fail("%s is not a copy of %s: cp %s %s" % (copy, orig, orig, copy))
    validator = os.path.join(os.path.dirname(tools["VENV_PYTHON"]), "kubernetes-validate") \
        if tools["VENV_PYTHON"] else None
    tmp = tempfile.mkdtemp(prefix="recps-deploy-render-")
    try:
        for overlay in ["base"] + ["overlays/" + o for o in OVERLAYS]:
            kinds = None
            for kubectl in kubectls:
                objs = render(kubectl, overlay)
                ver = subprocess.run([kubectl, "version", "--client"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True).stdout.split("\n")[0][:60]
                names = sorted((o["kind"], o["metadata"]["name"].rsplit("-", 1)[0]
                                if o["kind"] == "ConfigMap" else o["metadata"]["name"]) for o in objs)
                info("%s with %s: %d objects" % (overlay, ver, len(objs)))
                if kinds is not None and names != kinds:
                    fail("%s renders different objects with %s: %s vs %s" % (overlay, kubectl, names, kinds))
                kinds = names
                check_rendered(overlay, objs)
                if validator is None:
                    continue
                files = []
                for i, o in enumerate(objs):
                    if "." in o["apiVersion"].split("/")[0] and not o["apiVersion"].startswith(
                            ("apps/", "batch/", "policy/")):
                        info("  not validated (custom resource): %s/%s" % (o["kind"], o["metadata"]["name"]))
                        continue
                    f = os.path.join(tmp, "%s-%d-%s.yaml" % (overlay.replace("/", "-"), i, o["kind"]))
                    with open(f, "w") as out:
                        yaml.safe_dump(o, out)
                    files.append(f)
                r = subprocess.run([validator, "--strict", "-k", K8S_VERSION, "--quiet"] + files,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if r.returncode != 0:
                    fail("kubernetes-validate %s (%s):\n%s" % (overlay, kubectl, r.stdout))
                for f in files:
                    os.unlink(f)
        if validator is None:
            partly_skipped.append("kubernetes-validate and yamllint: " + tools["VENV_WHY"])
        else:
            lint = os.path.join(os.path.dirname(tools["VENV_PYTHON"]), "yamllint")
            r = subprocess.run([lint, "--strict", "-c", os.path.join(SRC, "deploy/.yamllint"),
                                os.path.join(SRC, "deploy")], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                fail("yamllint:\n" + r.stdout)
            else:
                info("yamllint: clean")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------- the manifests, run locally

class LocalCluster:
    """Runs a rendered overlay's pods as local processes: the exact command
    lines, with what Kubernetes would fill in replaced by local stand-ins."""

    def __init__(self, objs, work, procs):
        self.objs, self.work, self.procs = objs, work, procs
        self.services = {s["metadata"]["name"]: s for s in by_kind(objs, "Service")}
        self.configmaps = {c["metadata"]["name"]: c for c in by_kind(objs, "ConfigMap")}
        self.pods = []  # dicts: name, owner, template, index, ports {containerPort: local}
        for o, tmpl in pod_templates(objs):
            n = o["spec"].get("replicas", 1) if o["kind"] == "StatefulSet" else o["spec"]["parallelism"]
            for i in range(n):
                name = "%s-%d" % (o["metadata"]["name"], i)
                if o["kind"] == "Job":
                    name += "-x7k2p"  # Kubernetes adds a random suffix
                c = tmpl["spec"]["containers"][0]
                self.pods.append({
                    "name": name, "owner": o, "template": tmpl, "index": i,
                    "ports": {p["containerPort"]: free_port() for p in c.get("ports", [])},
                    "named": {p.get("name"): p["containerPort"] for p in c.get("ports", [])},
                })

    def tls_secret(self, secret, pod_name, d):
        """What docs/security.md puts in a recps-tls-<role> Secret (ca.crt,
        tls.crt, tls.key), made with recpsctl certs from one CA."""
        m = re.match(r"recps-tls-(\w+)$", secret)
        if not m:
            raise RuntimeError("secret %s is not a recps-tls-<role> Secret" % secret)
        ca = os.path.join(self.work, "ca")
        if not os.path.exists(os.path.join(ca, "ca.key")):
            subprocess.run([binary("recpsctl"), "certs", "init", ca], check=True,
                           stdout=subprocess.DEVNULL)
        subprocess.run([binary("recpsctl"), "certs", "issue", "--role=" + m.group(1),
                        "--name=" + pod_name, "--ca=" + ca, "--out=" + d], check=True,
                       stdout=subprocess.DEVNULL)
        os.rename(os.path.join(d, pod_name + ".crt"), os.path.join(d, "tls.crt"))
        os.rename(os.path.join(d, pod_name + ".key"), os.path.join(d, "tls.key"))

    def pods_of(self, kind, name):
        return [p for p in self.pods if p["owner"]["kind"] == kind and p["owner"]["metadata"]["name"] == name]

    def _matches(self, pod, selector):
        labels = pod["template"]["metadata"].get("labels", {})
        return all(labels.get(k) == v for k, v in selector.items())

    def resolve(self, host, port):
        """host:port as a pod would dial it -> the local port serving it."""
        parts = host.split(".")
        svc = self.services.get(parts[0])
        if svc is not None and (len(parts) == 1 or parts[1:3] in (["svc"], [])):
            pods = [p for p in self.pods if self._matches(p, svc["spec"]["selector"])]
            sp = [p for p in svc["spec"]["ports"] if p["port"] == port]
            if not pods or not sp:
                raise RuntimeError("Service %s has no pod or no port %d" % (host, port))
            target = sp[0].get("targetPort", port)
            pod = pods[0]
            cport = pod["named"][target] if isinstance(target, str) else target
            return pod["ports"][cport]
        if len(parts) >= 2 and parts[1] in self.services:
            svc = self.services[parts[1]]
            if svc["spec"].get("clusterIP") != "None":
                raise RuntimeError("%s: pod DNS names need a headless Service" % host)
            for p in self.pods:
                if p["name"] == parts[0] and self._matches(p, svc["spec"]["selector"]):
                    return p["ports"][port]
        raise RuntimeError("%s:%d does not resolve to any pod of the manifests" % (host, port))

    def command_line(self, pod):
        """(argv, env) of the pod's container, as a local process."""
        tmpl = pod["template"]
        c = tmpl["spec"]["containers"][0]
        env = clean_env()
        kenv = {}
        if pod["owner"]["kind"] == "Job" and pod["owner"]["spec"].get("completionMode") == "Indexed":
            kenv["JOB_COMPLETION_INDEX"] = str(pod["index"])
        for e in c.get("env", []):
            if "value" in e:
                kenv[e["name"]] = e["value"]
            elif "resourceFieldRef" in e["valueFrom"]:
                # What the kubelet gives: the container's limit in plain units
                # (bytes for memory, whole cores rounded up for cpu).
                ref = e["valueFrom"]["resourceFieldRef"]
                kenv[e["name"]] = str(k8s_quantity(c["resources"]["limits"][ref["resource"].split(".", 1)[1]]))
            else:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                kenv[e["name"]] = {"metadata.name": pod["name"], "metadata.namespace": "default",
                                   "metadata.annotations['batch.kubernetes.io/job-completion-index']":
                                   str(pod["index"])}[field]
        env.update(kenv)
        # Volumes -> directories of this pod.
        mounts = {}
        volumes = {v["name"]: v for v in tmpl["spec"].get("volumes", [])}
        for m in c.get("volumeMounts", []):
            d = os.path.join(self.work, pod["name"], m["name"])
            os.makedirs(d, exist_ok=True)
            v = volumes.get(m["name"])
            if v is not None and "configMap" in v:
                cm = self.configmaps[v["configMap"]["name"]]
                for key, data in cm["data"].items():
                    with open(os.path.join(d, key), "w") as f:
                        f.write(data)
            if v is not None and "secret" in v:
                self.tls_secret(v["secret"]["secretName"], pod["name"], d)
            mounts[m["mountPath"]] = d

        def subst(a):
            a = re.sub(r"\$\((\w+)\)", lambda m: kenv[m.group(1)], a)
            if mounts:  # one pass: a replacement may itself start with a mount path
                alt = "|".join(re.escape(mp) for mp in sorted(mounts, key=len, reverse=True))
                a = re.sub(r"(^|=)(" + alt + r")(?=/|$)", lambda m: m.group(1) + mounts[m.group(2)], a)

            def addr(m):
                host, port = m.group(1), int(m.group(2))
                if host in ("0.0.0.0", "[::]", ""):
                    return "127.0.0.1:%d" % pod["ports"][port]
                return "127.0.0.1:%d" % self.resolve(host, port)
            return re.sub(r"(?<=[=])([A-Za-z0-9][A-Za-z0-9.-]*|\[::\]):(\d+)$", addr, a)

        cmd = [subst(x) for x in c["command"]]
        name = os.path.basename(cmd[0])
        if os.path.dirname(cmd[0]) != IMAGE_BIN_DIR:
            raise RuntimeError("%s runs %s, not a binary of the image" % (pod["name"], cmd[0]))
        return [binary(name)] + cmd[1:] + [subst(a) for a in c.get("args", [])], env

    def start(self, pod):
        argv, env = self.command_line(pod)
        log = os.path.join(self.work, pod["name"] + ".log")
        info("start %s: %s" % (pod["name"], " ".join(shlex.quote(a) for a in argv)))
        return self.procs.start(pod["name"], argv, env, log, cwd=os.path.join(self.work, pod["name"]))


def final_evals(log_text):
    """rank -> (step, auc) of its last evaluation, from worker output."""
    evals = {}
    for m in re.finditer(r"recps-worker (\d+)\] eval after step (\d+): auc ([0-9.]+)", log_text):
        evals[int(m.group(1))] = (int(m.group(2)), float(m.group(3)))
    return evals


def job_steps(objs_or_text):
    m = re.search(r"^\s*steps:\s*(\d+)", objs_or_text, re.M)
    return int(m.group(1))


def k8s_local():
    """Runs the cpu overlay's coordinator, shard servers and worker pods as
    local processes from their rendered command lines and trains the job."""
    tools = load_tools()
    need_yaml(tools)
    if not tools["KUBECTLS"]:
        skip(tools["KUBECTL_WHY"])
    objs = render(tools["KUBECTLS"].split()[0], "overlays/cpu")
    procs = Processes()
    work = tempfile.mkdtemp(prefix="recps-deploy-k8s-")
    cluster = LocalCluster(objs, work, procs)
    job_text = list(by_kind(objs, "ConfigMap")[0]["data"].values())[0]
    steps = job_steps(job_text)
    servers, workers = [], []
    # Kubernetes starts everything at once; so does this.
    for pod in cluster.pods:
        p = cluster.start(pod)
        (workers if pod["owner"]["kind"] == "Job" else servers).append((pod, p))
    try:
        deadline = time.time() + 600
        # Prometheus would scrape each pod on its prometheus.io/port: every
        # pod must answer /metrics there at some point while it runs.
        unscraped = {pod["name"]: pod["ports"][int(pod["template"]["metadata"]["annotations"]["prometheus.io/port"])]
                     for pod in cluster.pods}
        while any(p.poll() is None for _, p in workers) and time.time() < deadline:
            for name, port in list(unscraped.items()):
                text = scrape(port, timeout=0.5)
                if text and "# TYPE recps_" in text:
                    info("scraped %s's /metrics on its prometheus.io/port" % name)
                    del unscraped[name]
            for pod, p in servers:
                if p.poll() is not None:
                    raise RuntimeError("%s exited with %s:\n%s" % (
                        pod["name"], p.returncode, tail(os.path.join(work, pod["name"] + ".log"))))
            time.sleep(0.2)
        text = ""
        for pod, p in workers:
            log = os.path.join(work, pod["name"] + ".log")
            text += open(log, errors="replace").read()
            if p.poll() is None:
                fail("%s did not finish in time:\n%s" % (pod["name"], tail(log)))
            elif p.returncode != 0:
                fail("%s exited with %d:\n%s" % (pod["name"], p.returncode, tail(log)))
        for name in unscraped:
            fail("%s never served /metrics on its prometheus.io/port" % name)
        evals = final_evals(text)
        world = sum(int(flag_value(split_launch_args(pod["template"]["spec"]["containers"][0]["args"])[0],
                                   "nproc_per_node") or 1) for pod, _ in workers)
        info("final evaluations (rank: step, auc): %s" % evals)
        if sorted(evals) != list(range(world)):
            fail("expected evaluations from ranks 0..%d, got %s" % (world - 1, sorted(evals)))
        for rank, (step, auc) in evals.items():
            if step != steps or auc < MIN_AUC:
                fail("rank %d: last evaluation after step %d with auc %.4f (want step %d, auc >= %.2f)"
                     % (rank, step, auc, steps, MIN_AUC))
        # Pods stop with SIGTERM; each server must exit cleanly within its
        # terminationGracePeriodSeconds.
        for pod, p in servers:
            grace = pod["template"]["spec"].get("terminationGracePeriodSeconds", 30)
            t0 = time.time()
            code = procs.stop(p, grace=grace)
            if code != 0:
                fail("%s exited with %s on SIGTERM:\n%s" % (pod["name"], code,
                                                            tail(os.path.join(work, pod["name"] + ".log"))))
            else:
                info("%s stopped on SIGTERM in %.1fs" % (pod["name"], time.time() - t0))
    finally:
        procs.stop_all()
        if not failures:
            shutil.rmtree(work, ignore_errors=True)
        else:
            info("logs kept in " + work)


# --------------------------------------------------------------- monitoring

def monitoring():
    """promtool check config / check rules / test rules; the dashboard parses."""
    tools = load_tools()
    promtool = tools["PROMTOOL"]
    mon = os.path.join(SRC, "deploy/monitoring")
    dash = json.load(open(os.path.join(mon, "grafana/recps-dashboard.json")))
    ids = [p["id"] for p in dash["panels"]]
    if len(ids) != len(set(ids)):
        fail("dashboard panel ids are not unique")
    for p in dash["panels"]:
        if p["type"] != "row" and not all(t.get("expr") for t in p.get("targets", [])):
            fail("dashboard panel %r has a target without a query" % p["title"])
    if not promtool:
        skip(tools["PROMTOOL_WHY"])

    def run(args, cwd):
        r = subprocess.run([promtool] + args, cwd=cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        info("$ promtool %s\n%s" % (" ".join(args), r.stdout.strip()))
        return r
    if run(["check", "rules", "rules/recps.rules.yml"], mon).returncode != 0:
        fail("promtool check rules")
    if run(["test", "rules", "recps.rules.test.yml"], os.path.join(mon, "rules")).returncode != 0:
        fail("promtool test rules")
    # Every alert has a unit test.
    rules_text = open(os.path.join(mon, "rules/recps.rules.yml")).read()
    tests_text = open(os.path.join(mon, "rules/recps.rules.test.yml")).read()
    for alert in re.findall(r"- alert: (\w+)", rules_text):
        if "alertname: %s\n" % alert not in tests_text:
            fail("alert %s has no unit test in recps.rules.test.yml" % alert)
    r = run(["check", "config", "prometheus.yml"], mon)
    if r.returncode != 0 and "field kubernetes_sd_configs not found" in r.stdout:
        # Debian's Prometheus is built without Kubernetes discovery. Check
        # the rest (relabelling, rule files) with the discovery swapped for
        # static targets.
        info("this promtool has no kubernetes_sd_configs (Debian builds it without); "
             "checking the config with static targets in its place")
        tmp = tempfile.mkdtemp(prefix="recps-deploy-prom-")
        try:
            text = open(os.path.join(mon, "prometheus.yml")).read()
            text = re.sub(r"kubernetes_sd_configs:\n(\s+)- role: pod",
                          r"static_configs:\n\1- targets: ['127.0.0.1:9400']", text)
            shutil.copytree(os.path.join(mon, "rules"), os.path.join(tmp, "rules"))
            with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
                f.write(text)
            r = run(["check", "config", "prometheus.yml"], tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if r.returncode != 0:
        fail("promtool check config")


def referenced_metrics():
    """Metric names the rules (less the pending group) and dashboard use."""
    mon = os.path.join(SRC, "deploy/monitoring")
    rules = open(os.path.join(mon, "rules/recps.rules.yml")).read()
    rules = re.sub(r"#.*", "", rules).split("- name: recps-pending")[0]
    dash = json.load(open(os.path.join(mon, "grafana/recps-dashboard.json")))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [dash["templating"]["list"][1]["definition"]]
    names = set(re.findall(r"\b(recps_[a-z0-9_]+)", rules + "\n".join(exprs)))
    return names


def scrape(port, timeout=2.0):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return None


def exported_names(text):
    names, types = set(), {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, n, t = line.split()[:4]
            types[n] = t
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names, types


def metrics():
    """Every metric the dashboard and the rules use is exported by a real
    coordinator, shard server or worker."""
    procs = Processes()
    work = tempfile.mkdtemp(prefix="recps-deploy-metrics-")
    # The small job with checkpoints, so the coordinator exports the newest
    # complete checkpoint's time (the checkpoint-age alert's metric).
    job = os.path.join(work, "job.textproto")
    with open(os.path.join(SRC, "examples/small.textproto")) as f:
        text = f.read()
    if "\ntraining {" not in text:
        raise RuntimeError("examples/small.textproto has no training block to add checkpoints to")
    with open(job, "w") as f:
        f.write(text.replace("\ntraining {", '\ntraining {\n  checkpoint { dir: "%s" every_steps: 1000 }'
                             % os.path.join(work, "checkpoints"), 1))
    try:
        c = procs.start("coordinator", [binary("recps-coordinator"), "--state_dir=" + work + "/coord",
                                        "--job=" + job, "--num_shards=1", "--world_size=1", "--listen=127.0.0.1:0",
                                        "--lease=1s",
                                        "--metrics_listen=127.0.0.1:0", "--port_file=" + work + "/coord.ports",
                                        "--insecure"],
                        clean_env(), work + "/coordinator.log")
        read_ports = lambda f: (lambda t: tuple(map(int, t.split())) if len(t.split()) == 2 else None)(  # noqa: E731
            open(f).read() if os.path.exists(f) else "")
        cports = wait_for("the coordinator's ports", lambda: read_ports(work + "/coord.ports"), 30,
                          [("coordinator", c)])
        s = procs.start("shard", [binary("recps-shard"), "--job=" + job, "--world_size=1",
                                  "--coordinator=127.0.0.1:%d" % cports[0], "--listen=127.0.0.1:0",
                                  "--metrics_listen=127.0.0.1:0", "--port_file=" + work + "/shard.ports",
                                  "--insecure"],
                        clean_env(), work + "/shard.log")
        sports = wait_for("the shard server's ports", lambda: read_ports(work + "/shard.ports"), 30, [("shard", s)])
        wport = free_port()
        w = procs.start("worker", [binary("recps-worker"), "--coordinator=127.0.0.1:%d" % cports[0],
                                   "--rank=0", "--world_size=1", "--steps=3000", "--threads=1",
                                   "--metrics_listen=127.0.0.1:%d" % wport, "--insecure"],
                        clean_env(), work + "/worker.log")
        # The worker serves metrics only while it trains: scrape until it
        # has stepped and evaluated (every scrape's names are kept).
        worker_names, worker_types = set(), {}

        def worker_scraped():
            text = scrape(wport)
            if text:
                n, t = exported_names(text)
                worker_names.update(n)
                worker_types.update(t)
            return w.poll() is not None or "eval after step" in tail(work + "/worker.log", 5)
        wait_for("the worker to train", worker_scraped, 300, [("coordinator", c), ("shard", s)])
        code = w.wait(300)
        if code != 0:
            raise RuntimeError("the worker failed (%d):\n%s" % (code, tail(work + "/worker.log")))
        names, types = set(worker_names), dict(worker_types)

        def add(who, port):
            text = scrape(port)
            if text is None:
                raise RuntimeError("cannot scrape the %s on port %d" % (who, port))
            n, t = exported_names(text)
            names.update(n)
            types.update(t)
            return n
        # The shard server sets its per-table gauges (recps_shard_table_rows,
        # _bytes) only when asked for Stats, as `recpsctl status` does.
        r = subprocess.run([binary("recpsctl"), "--coordinator=127.0.0.1:%d" % cports[0], "--insecure",
                            "status"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
        info("recpsctl status (exit %d):\n%s" % (r.returncode, r.stdout.strip()))
        add("shard server", sports[1])
        # A lease running out: kill the shard server; with --lease=1s the
        # coordinator counts the expiration (recps_coordinator_lease_expirations_total).
        os.killpg(s.pid, signal.SIGKILL)
        s.wait()
        wait_for("the shard server's lease to expire",
                 lambda: "recps_coordinator_lease_expirations_total" in add("coordinator", cports[1]),
                 30, [("coordinator", c)])
        info("exported: %d metric names (worker: %s)"
             % (len(names), sorted(x for x in worker_names if x.startswith("recps_"))))
        pending = []
        for name in sorted(referenced_metrics()):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            ok = name in names or (name != base and types.get(base) == "histogram") or \
                types.get(name) == "histogram"
            if ok:
                info("  exported: " + name)
            elif (name in WORKER_RENAMED or base in WORKER_RENAMED) and "recps_worker" in worker_names:
                # The worker still exports the old recps_worker{quantity=...}
                # gauges: the rename is not on this branch yet.
                pending.append(name)
                info("  SKIPPED (the worker metrics rename has not landed on this branch): " + name)
            else:
                fail("the dashboard or the rules use %s, which no daemon exports" % name)
        if pending:
            info("%d worker metric name(s) wait for the rename: %s" % (len(pending), ", ".join(pending)))
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


# -------------------------------------------------------------------- slurm

def slurm():
    """deploy/slurm/recps.sbatch with a 2-node allocation's variables set by
    hand and srun/scontrol replaced by local shims: trains the small job."""
    procs = Processes()
    work = tempfile.mkdtemp(prefix="recps-deploy-slurm-")
    env = clean_env()
    env["PATH"] = os.path.join(SRC, "tests/deploy/slurm_shim") + os.pathsep + env["PATH"]
    # Two "nodes", both this machine, under two names that resolve here.
    env.update({
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "recps", "SLURM_JOB_NODELIST": "localhost,127.0.0.1",
        "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURMD_NODENAME": "localhost",
        "SLURM_SUBMIT_DIR": SRC, "SLURM_CPUS_ON_NODE": str(os.cpu_count()),
        "RECPS_BIN": os.path.join(BUILD, "bin"), "RECPS_NPROC_PER_NODE": "2",
        "RECPS_COORD_PORT": str(free_port()), "RECPS_SHARD_PORT": str(free_port_range(2)),
        "RECPS_METRICS_PORT": str(free_port_range(3)), "RECPS_WORK_DIR": work + "/run",
        "RECPS_WORKER_ARGS": "--threads=1",
    })
    # Mutual TLS, as docs/security.md sets it up: one CA on a shared path.
    subprocess.run([binary("recpsctl"), "certs", "init", work + "/certs"], check=True,
                   stdout=subprocess.DEVNULL)
    env["RECPS_TLS_DIR"] = work + "/certs"
    log = work + "/sbatch.log"
    try:
        p = procs.start("recps.sbatch", ["bash", os.path.join(SRC, "deploy/slurm/recps.sbatch")],
                        env, log, cwd=work)
        try:
            code = p.wait(600)
        except subprocess.TimeoutExpired:
            code = None
        text = open(log, errors="replace").read()
        if code != 0:
            fail("recps.sbatch exited with %s:\n%s" % (code, text[-4000:]))
        evals = final_evals(text)
        steps = job_steps(open(os.path.join(SRC, "examples/small.textproto")).read())
        info("final evaluations (rank: step, auc): %s" % evals)
        if sorted(evals) != [0, 1]:
            fail("expected evaluations from ranks 0 and 1, got %s" % sorted(evals))
        for rank, (step, auc) in evals.items():
            if step != steps or auc < MIN_AUC:
                fail("rank %d: last evaluation after step %d with auc %.4f" % (rank, step, auc))
        # The script stops its servers when the workers are done.
        leftovers = session_members(p.pid)
        if leftovers:
            fail("processes of recps.sbatch still running after it exited: %s" % leftovers)
        for f in ("coordinator.log", "shards.log"):
            info("--- %s (tail)\n%s" % (f, tail(os.path.join(work, "run", f), 5)))
    finally:
        procs.stop_all()
        if not failures:
            shutil.rmtree(work, ignore_errors=True)
        else:
            info("logs kept in " + work)


CHECKS = {f.__name__: f for f in (image, manifests, k8s_local, monitoring, metrics, slurm)}


def main():
    global SRC, BUILD
    if len(sys.argv) != 4 or sys.argv[1] not in CHECKS:
        print(__doc__, file=sys.stderr)
        return 2
    SRC, BUILD = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    testlib.BUILD = BUILD
    t0 = time.time()
    try:
        CHECKS[sys.argv[1]]()
    except RuntimeError as e:
        fail(str(e))
    if failures:
        verdict, code = "FAILED (%d)" % len(failures), 1
    elif partly_skipped:
        # What ran passed, but the check is not complete: report a skip.
        for why in partly_skipped:
            info("SKIPPED: " + why)
        verdict, code = "passed in part, rest skipped", SKIP
    else:
        verdict, code = "passed", 0
    info("%s: %s in %.1fs" % (sys.argv[1], verdict, time.time() - t0))
    return code


if __name__ == "__main__":
    sys.exit(main())
