#!/usr/bin/python3
"""Tests of deploy/: the container image recipe, the Kubernetes manifests,
the monitoring configs and the SLURM script, checked against the real
binaries.

  deploy_test.py CHECK SOURCE_DIR BUILD_DIR

CHECK is one of: image, manifests (manifests_test.py), k8s_local, k8s_drain
and k8s_resume (k8s_drain_test.py), monitoring, metrics, slurm (see the
functions of the same names). Tools come from tests/deploy/setup.sh;
a check whose tool cannot be had exits 77 (ctest: skipped) saying which.
Every process a check starts is stopped when it ends, however it ends.
"""

import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import k8s_drain_test
import manifests_test
import testlib
from k8slib import (IMAGE_BIN_DIR, LocalCluster, Processes, by_kind, final_evals, flag_value,
                    free_port, free_port_range, job_steps, load_tools, need_yaml, render, scrape,
                    split_launch_args)
from testlib import MIN_AUC, SKIP, binary, clean_env, fail, failures, info, skip, tail, wait_for

BINARIES = ["recps", "recps-shard", "recps-coordinator", "recps-worker", "recpsctl"]

SRC = BUILD = None


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
        # The shard server refreshes its per-table gauges (recps_shard_table_rows,
        # _bytes) every second and on Stats, which `recpsctl status` asks for:
        # the scrape below has them without waiting.
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
        for name in sorted(referenced_metrics()):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            ok = name in names or (name != base and types.get(base) == "histogram") or \
                types.get(name) == "histogram"
            if ok:
                info("  exported: " + name)
            else:
                fail("the dashboard or the rules use %s, which no daemon exports" % name)
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


CHECKS = {f.__name__: f for f in (image, manifests_test.manifests, k8s_local, monitoring, metrics, slurm,
                                   k8s_drain_test.k8s_drain, k8s_drain_test.k8s_resume)}


def main():
    global SRC, BUILD
    if len(sys.argv) != 4 or sys.argv[1] not in CHECKS:
        print(__doc__, file=sys.stderr)
        return 2
    SRC, BUILD = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    testlib.SRC, testlib.BUILD = SRC, BUILD
    t0 = time.time()
    try:
        CHECKS[sys.argv[1]]()
    except RuntimeError as e:
        fail(str(e))
    if failures:
        verdict, code = "FAILED (%d)" % len(failures), 1
    elif testlib.partly_skipped:
        # What ran passed, but the check is not complete: report a skip.
        for why in testlib.partly_skipped:
            info("SKIPPED: " + why)
        verdict, code = "passed in part, rest skipped", SKIP
    else:
        verdict, code = "passed", 0
    info("%s: %s in %.1fs" % (sys.argv[1], verdict, time.time() - t0))
    return code


if __name__ == "__main__":
    sys.exit(main())
