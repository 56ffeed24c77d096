"""The cpu overlay's pods run as local processes (k8slib.LocalCluster), and
pods deleted the way Kubernetes deletes them:

  k8s_drain   a shard server pod deleted mid-run: its rendered preStop
              drains it (recpsctl drain --apply), SIGTERM stops it, and the
              StatefulSet starts it again under the same name: it comes back
              owning nothing. The run must end exactly as an undisturbed run
              of the same manifests: the same final evaluations and, in the
              final checkpoint, every table's ids and weights bit for bit
              (sync mode is deterministic), so no row was lost.
              Parts: `drain` (that much), `rebalance_while_training` (then
              `recpsctl rebalance --apply` gives the new pod its share back
              while the workers train) and `drain_idle` (recps-shard-0's pod
              deleted after the workers are done).
  k8s_resume  a worker pod lost after a complete checkpoint, with the Job
              controller's part played by the test (a failed pod is
              replaced under backoffLimit and podFailurePolicy; one that
              exits 0 completes its index): the new pods resume from the
              newest checkpoint and the run ends. Parts: `killed` (SIGKILL:
              a lost node, an OOM kill), `deleted` (kubectl delete pod:
              SIGTERM, SIGKILL at terminationGracePeriodSeconds) and
              `shard_killed` (a shard server killed and restarted in its
              pod: the workers fail, and their new pods resume).

RECPS_K8S_ONLY=part,... picks parts. A part listed in PENDING waits for a
change outside deploy/ and is not run, saying which (RECPS_K8S_FORCE=1 runs
it anyway); delete its entry once the change has landed. A check left with
no part to run exits 77 (skipped).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import testlib
from k8slib import (LocalCluster, Processes, by_kind, final_evals, job_steps, load_tools, need_yaml,
                    render, split_launch_args, flag_value)
from testlib import MIN_AUC, binary, clean_env, fail, failures, info, skip, tail, wait_for

# Parts that need a change outside deploy/, with what they wait for.
PENDING = {
    "drain_idle":
        "a hand-over with no worker stepping: today a drain after the workers are done waits for a "
        "step to be applied that no worker pushes any more, until --step_timeout (1m), then fails "
        "and the server keeps its slots",
    "rebalance_while_training":
        "workers forgetting a shard server's incarnation once it owns nothing (today a drained pod "
        "started again at the same address and given slots while the workers train fails every "
        "worker: DATA_LOSS, 'shard server ... restarted: the request names incarnation ...')",
}
# The job's length here: half the manifests' (CI time), with checkpoints and
# evaluations every 500 steps instead of 1000.
STEPS = 3000
EVERY = 500
DRAIN_AT_STEP = 1000   # rank 0's evaluation after which the shard pod is deleted
RESUME_AFTER_STEP = 1000  # the complete checkpoint after which a worker pod is lost


def admin_flags(cluster):
    """recpsctl's flags for the local coordinator with the admin certificate
    of the cluster's CA (the one `recpsctl certs init` made)."""
    coord = cluster.pods_of("StatefulSet", "recps-coordinator")[0]
    ca = os.path.join(cluster.work, "ca")
    return ["--coordinator=127.0.0.1:%d" % coord["ports"][7000], "--tls_ca=" + ca + "/ca.crt",
            "--tls_cert=" + ca + "/admin.crt", "--tls_key=" + ca + "/admin.key", "--timeout=30s"]


def recpsctl(cluster, *args):
    r = subprocess.run([binary("recpsctl")] + list(args) + admin_flags(cluster), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=clean_env(), timeout=120)
    return r.returncode, r.stdout


def owned(cluster, address):
    """Slots plus routed tables (table-wise, or with slots of their own)
    `address` owns in the coordinator's shard map (None: not in it)."""
    code, out = recpsctl(cluster, "shards", "--json")
    start = out.find("{")
    if start < 0:
        raise RuntimeError("recpsctl shards --json (exit %d) printed no JSON:\n%s" % (code, out))
    shards = json.loads(out[start:])
    for s in shards["servers"]:
        if s["address"] == address:
            return int(s.get("slot_count", 0)) + sum(
                1 for r in shards.get("routed_tables", []) if address in r.get("servers", []))
    return None


def log_of(cluster, pod):
    return os.path.join(cluster.work, pod["name"] + ".log")


def rank_log_has(cluster, pod, pattern):
    try:
        return re.search(pattern, open(log_of(cluster, pod), errors="replace").read())
    except OSError:
        return None


class Run:
    """One run of the rendered overlay: every pod started at once, as
    Kubernetes does. `servers` maps a StatefulSet pod's name, `workers` a
    Job index, to its current pod and process."""

    def __init__(self, objs, tag):
        self.procs = Processes()
        self.work = tempfile.mkdtemp(prefix="recps-deploy-%s-" % tag)
        self.cluster = LocalCluster(objs, self.work, self.procs)
        self.servers, self.workers = {}, {}
        self.steps = job_steps(list(by_kind(objs, "ConfigMap")[0]["data"].values())[0])
        for pod in self.cluster.pods:
            p = self.cluster.start(pod)
            if pod["owner"]["kind"] == "Job":
                self.workers[pod["index"]] = (pod, p)
            else:
                self.servers[pod["name"]] = (pod, p)

    def alive(self):
        return [(name, p) for name, (_, p) in self.servers.items()]

    def checkpoints(self):
        return os.path.join(self.work, "pvc", "recps-checkpoints")

    def wait_rank0(self, pattern, timeout):
        pod = self.workers[0][0]
        return wait_for("rank 0 to log %r" % pattern,
                        lambda: rank_log_has(self.cluster, self.workers[0][0], pattern), timeout,
                        self.alive() + [(pod["name"], self.workers[0][1])])

    def evals(self):
        text = ""
        for pod in self.cluster.pods:
            if pod["owner"]["kind"] == "Job" and os.path.exists(log_of(self.cluster, pod)):
                text += open(log_of(self.cluster, pod), errors="replace").read()
        return final_evals(text)

    def wait_workers(self, timeout):
        """Waits for every worker pod to exit 0."""
        deadline = time.time() + timeout
        for index, (pod, p) in sorted(self.workers.items()):
            try:
                code = p.wait(max(deadline - time.time(), 1))
            except subprocess.TimeoutExpired:
                raise RuntimeError("%s did not finish in time:\n%s" % (pod["name"], tail(log_of(self.cluster, pod))))
            if code != 0:
                raise RuntimeError("%s exited with %d:\n%s" % (pod["name"], code, tail(log_of(self.cluster, pod))))

    def check_trained(self):
        evals = self.evals()
        info("final evaluations (rank: step, auc): %s" % evals)
        world = len(self.workers) * int(flag_value(split_launch_args(
            self.workers[0][0]["template"]["spec"]["containers"][0]["args"])[0], "nproc_per_node") or 1)
        if sorted(evals) != list(range(world)):
            fail("expected evaluations from ranks 0..%d, got %s" % (world - 1, sorted(evals)))
        for rank, (step, auc) in evals.items():
            if step != self.steps or auc < MIN_AUC:
                fail("rank %d: last evaluation after step %d with auc %.4f (want step %d, auc >= %.2f)"
                     % (rank, step, auc, self.steps, MIN_AUC))
        return evals

    def export(self, tables):
        """table -> (ids, weights) bytes of the newest complete checkpoint."""
        out = {}
        for t in tables:
            d = os.path.join(self.work, "export")
            subprocess.run([binary("recpsctl"), "export", d, "--table=" + t, "--dir=" + self.checkpoints()],
                           check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=clean_env())
            out[t] = tuple(open(os.path.join(d, t + ext), "rb").read() for ext in (".ids", ".weights"))
        return out

    def close(self):
        self.procs.stop_all()
        if not failures and sys.exc_info()[0] is None:
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            info("logs kept in " + self.work)


def render_cpu():
    tools = load_tools()
    need_yaml(tools)
    if not tools["KUBECTLS"]:
        skip(tools["KUBECTL_WHY"])
    objs = render(tools["KUBECTLS"].split()[0], "overlays/cpu")
    config = by_kind(objs, "ConfigMap")[0]["data"]
    for key, text in config.items():
        text = re.sub(r"^(\s*steps:\s*)\d+", r"\g<1>%d" % STEPS, text, count=1, flags=re.M)
        text = re.sub(r"every_steps:\s*\d+", "every_steps: %d" % EVERY, text)
        config[key] = re.sub(r"eval_interval:\s*\d+", "eval_interval: %d" % EVERY, text)
    return objs


def undisturbed(objs, tables):
    """(final evaluations, final checkpoint's rows) of a run left alone."""
    run = Run(objs, "reference")
    try:
        run.wait_workers(600)
        return run.check_trained(), run.export(tables)
    finally:
        run.close()


def delete_shard_pod(run, name):
    """Deletes a shard server pod as the kubelet does; its preStop drain and
    its exit on SIGTERM must succeed, and its server own nothing after."""
    cluster = run.cluster
    pod, p = run.servers[name]
    address = "127.0.0.1:%d" % pod["ports"][7100]  # what $(SHARD_ADDRESS) stands for here
    before = owned(cluster, address)
    info("%s (%s) owns %s slots and tables" % (name, address, before))
    t0 = time.time()
    hook_code, hook_out, code = cluster.delete(pod, p)
    if hook_code != 0:
        fail("the preStop drain of %s exited %s:\n%s" % (name, hook_code, hook_out))
    if code != 0:
        fail("%s exited %s on SIGTERM after its drain:\n%s" % (name, code, tail(log_of(cluster, pod))))
    after = owned(cluster, address)
    info("%s deleted in %.1fs; %s owns %s slots and tables" % (name, time.time() - t0, address, after))
    if not before or after != 0:
        fail("%s should own slots before its drain and none after (it stays in the map): %s, then %s"
             % (address, before, after))
    return pod, address


def drained(objs, tables, parts):
    """The same, with recps-shard-1's pod deleted (preStop drain, SIGTERM)
    at rank 0's evaluation after DRAIN_AT_STEP and started again. Part
    rebalance_while_training then gives it its share back while the workers
    train; part drain_idle deletes recps-shard-0's pod once they are done."""
    run = Run(objs, "drain")
    try:
        cluster = run.cluster
        run.wait_rank0(r"eval after step %d:" % DRAIN_AT_STEP, 300)
        pod, address = delete_shard_pod(run, "recps-shard-1")
        # The StatefulSet's new pod: the same name, so the same address.
        t0 = time.time()
        run.servers[pod["name"]] = (pod, cluster.start(pod))
        code, out = wait_for("the new %s to hold the map (recpsctl status healthy)" % pod["name"],
                             lambda: (lambda r: r if r[0] == 0 else None)(recpsctl(cluster, "status")),
                             120, run.alive())
        info("recpsctl status %.1fs after the new %s started:\n%s" % (time.time() - t0, pod["name"], out))
        if owned(cluster, address) != 0:
            fail("the new %s should come back owning nothing" % pod["name"])
        if "rebalance_while_training" in parts:
            code, out = recpsctl(cluster, "rebalance", "--apply")
            info("recpsctl rebalance --apply (exit %d):\n%s" % (code, out))
            back = owned(cluster, address)
            if code != 0 or not back:
                fail("the rebalance should give %s its share back (exit %d, %s slots and tables)"
                     % (address, code, back))
        run.wait_workers(600)
        for name, (_, sp) in run.servers.items():
            if sp.poll() is not None:
                fail("%s exited early with %s" % (name, sp.returncode))
        result = run.check_trained(), run.export(tables)
        if "drain_idle" in parts:
            delete_shard_pod(run, "recps-shard-0")
        return result
    finally:
        run.close()


def k8s_drain():
    """A shard pod drained by its preStop, deleted and started again loses no row."""
    parts = chosen_parts(["drain", "rebalance_while_training", "drain_idle"])
    if not parts:
        return
    objs = render_cpu()
    job = list(by_kind(objs, "ConfigMap")[0]["data"].values())[0]
    tables = re.findall(r'^tables \{\s*name: "([^"]+)"', job, re.M)
    t0 = time.time()
    reference = undisturbed(objs, tables)
    info("undisturbed run: %.1fs" % (time.time() - t0))
    if failures:
        return
    t0 = time.time()
    evals, rows = drained(objs, tables, parts)
    info("run with the drain: %.1fs" % (time.time() - t0))
    if evals != reference[0]:
        fail("the final evaluations differ from the undisturbed run's: %s vs %s" % (evals, reference[0]))
    for t in tables:
        if rows[t] != reference[1][t]:
            fail("table %s of the final checkpoint differs from the undisturbed run's (%d vs %d ids): "
                 "rows were lost or changed" % (t, len(rows[t][0]) // 8, len(reference[1][t][0]) // 8))
    if not failures:
        info("every table's ids and weights in the final checkpoint equal the undisturbed run's: %s"
             % ", ".join("%s %d rows" % (t, len(rows[t][0]) // 8) for t in tables))


def job_controller(run, objs, timeout):
    """Plays the Job controller until every index completed or the Job
    failed: a pod that exits 0 completes its index; one that exits with a
    podFailurePolicy FailJob code fails the Job; any other exit is a failure
    counted against backoffLimit, and the index gets a new pod."""
    job = by_kind(objs, "Job")[0]
    limit = job["spec"].get("backoffLimit", 6)
    fail_codes, ignore_codes = set(), set()
    for r in job["spec"].get("podFailurePolicy", {}).get("rules", []):
        if r.get("onExitCodes", {}).get("operator") != "In":
            continue
        if r["action"] == "FailJob":
            fail_codes |= set(r["onExitCodes"]["values"])
        elif r["action"] == "Ignore":
            ignore_codes |= set(r["onExitCodes"]["values"])
    failed, done, attempt = 0, set(), 0
    deadline = time.time() + timeout
    while len(done) < len(run.workers):
        if time.time() > deadline:
            return "the Job did not complete in %ds (indices done: %s, pods failed: %d)" % (
                timeout, sorted(done), failed)
        for name, p in run.alive():
            if p.poll() is not None:
                return "%s exited with %s" % (name, p.returncode)
        for index, (pod, p) in sorted(run.workers.items()):
            if index in done or p.poll() is None:
                continue
            if p.returncode == 0:
                info("Job: index %d complete (%s exited 0)" % (index, pod["name"]))
                done.add(index)
            elif p.returncode in fail_codes:
                return "%s exited %d: podFailurePolicy fails the Job" % (pod["name"], p.returncode)
            else:
                # podFailurePolicy Ignore: replaced, not counted.
                failed += 0 if p.returncode in ignore_codes else 1
                if failed > limit:
                    return "%d failed pods, over backoffLimit %d: the Job failed" % (failed, limit)
                attempt += 1
                new = run.cluster.replacement(pod, attempt)
                info("Job: %s exited %d (failure %d of %d allowed); starting %s"
                     % (pod["name"], p.returncode, failed, limit, new["name"]))
                run.workers[index] = (new, run.cluster.start(new))
        time.sleep(0.2)
    return None


def resume_part(objs, part):
    run = Run(objs, "resume-" + part)
    try:
        cluster = run.cluster
        manifest = os.path.join(run.checkpoints(), "step-%012d" % RESUME_AFTER_STEP, "MANIFEST")
        wait_for("the complete checkpoint at step %d" % RESUME_AFTER_STEP,
                 lambda: os.path.exists(manifest), 300, run.alive())
        if part == "shard_killed":
            # The kubelet restarts the container in the same pod: same name,
            # same address, a new process without the rows.
            pod, p = run.servers["recps-shard-1"]
            info("SIGKILL %s (an OOM kill); the kubelet starts it again" % pod["name"])
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            run.servers[pod["name"]] = (pod, cluster.start(pod))
        elif part == "killed":
            pod, p = run.workers[0]
            info("SIGKILL %s (a lost node, an OOM kill)" % pod["name"])
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        else:
            cluster.delete(*run.workers[0])
        why = job_controller(run, objs, 600)
        if why:
            fail("%s: %s\n--- rank 0 (%s):\n%s" % (part, why, run.workers[0][0]["name"],
                                                   tail(log_of(cluster, run.workers[0][0]), 15)))
            return
        resumed = [int(m) for pod in cluster.pods if pod["owner"]["kind"] == "Job"
                   for m in re.findall(r"resuming at step (\d+)", open(log_of(cluster, pod), errors="replace").read())
                   if os.path.exists(log_of(cluster, pod))]
        info("%s: resumed at steps %s" % (part, resumed))
        if not resumed or min(resumed) < RESUME_AFTER_STEP:
            fail("%s: the new worker pods should resume at step %d or later, not %s"
                 % (part, RESUME_AFTER_STEP, resumed))
        run.check_trained()
    finally:
        run.close()


def chosen_parts(parts):
    """The parts of a check to run: RECPS_K8S_ONLY's (default: all), less
    those PENDING unless RECPS_K8S_FORCE=1. Each pending one is reported;
    a check left with nothing to run is skipped (exit 77)."""
    only = [x for x in os.environ.get("RECPS_K8S_ONLY", "").split(",") if x]
    parts = [x for x in parts if not only or x in only]
    force = os.environ.get("RECPS_K8S_FORCE") == "1"
    todo = [x for x in parts if force or x not in PENDING]
    for x in parts:
        if x not in todo:
            info("SKIPPED part %s: it waits for %s" % (x, PENDING[x]))
    if parts and not todo:
        testlib.partly_skipped.append("every part chosen (%s) waits for a change outside deploy/"
                                      % ", ".join(parts))
    return todo


def k8s_resume():
    """Lost worker pods are replaced and resume from the newest checkpoint."""
    todo = chosen_parts(["killed", "deleted", "shard_killed"])
    if not todo:
        return
    objs = render_cpu()
    for part in todo:
        info("--- part %s" % part)
        resume_part(objs, part)
