"""The Kubernetes manifests as the deploy tests use them: rendered with
kubectl kustomize, and run as local processes (LocalCluster: each pod's
rendered command, args and env, with what Kubernetes fills in replaced by
local stand-ins). Also the child-process bookkeeping every test shares."""

import atexit
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import testlib
from testlib import binary, clean_env, info, skip

IMAGE_BIN_DIR = "/opt/recps/bin"  # where the Dockerfile puts the binaries


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


# -------------------------------------------------------------------- tools

def load_tools():
    setup = os.path.join(testlib.SRC, "tests/deploy/setup.sh")
    r = subprocess.run([setup, testlib.BUILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tools = {}
    path = os.path.join(testlib.BUILD, "deploy-tools/tools.env")
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


# ------------------------------------------------------------------- render

def render(kubectl, overlay):
    import yaml
    path = os.path.join(testlib.SRC, "deploy/k8s", overlay)
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

    def tls_secret(self, secret, d):
        """What docs/security.md puts in a recps-tls-<role> Secret: ca.crt,
        and the role's certificate and key from `recpsctl certs init` as
        tls.crt and tls.key. One Secret, so every pod that mounts it has the
        same certificate (the Job's worker pods share one identity)."""
        m = re.match(r"recps-tls-(\w+)$", secret)
        if not m:
            raise RuntimeError("secret %s is not a recps-tls-<role> Secret" % secret)
        ca = os.path.join(self.work, "ca")
        if not os.path.exists(os.path.join(ca, "ca.key")):
            subprocess.run([binary("recpsctl"), "certs", "init", ca], check=True,
                           stdout=subprocess.DEVNULL)
        for src, dst in (("ca.crt", "ca.crt"), (m.group(1) + ".crt", "tls.crt"), (m.group(1) + ".key", "tls.key")):
            shutil.copyfile(os.path.join(ca, src), os.path.join(d, dst))

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

    def replacement(self, pod, attempt):
        """The pod a Job makes in place of a failed one: the same index and
        template under a new name (so new emptyDirs and certificates)."""
        new = dict(pod, name="%s-%d-r%d" % (pod["owner"]["metadata"]["name"], pod["index"], attempt))
        self.pods.append(new)
        return new

    def _kube_env(self, pod, c):
        """The container's env as Kubernetes sets it: values, the downward
        API, limits, and $(VAR) of earlier entries expanded in values."""
        kenv = {}
        if pod["owner"]["kind"] == "Job" and pod["owner"]["spec"].get("completionMode") == "Indexed":
            kenv["JOB_COMPLETION_INDEX"] = str(pod["index"])
        for e in c.get("env", []):
            if "value" in e:
                kenv[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: kenv.get(m.group(1), m.group(0)), e["value"])
            elif "resourceFieldRef" in e["valueFrom"]:
                # What the kubelet gives: the container's limit in plain units
                # (bytes for memory, whole cores rounded up for cpu).
                ref = e["valueFrom"]["resourceFieldRef"]
                kenv[e["name"]] = str(k8s_quantity(c["resources"]["limits"][ref["resource"].split(".", 1)[1]]))
            else:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                kenv[e["name"]] = {"metadata.name": pod["name"], "metadata.namespace": "default",
                                   "spec.nodeName": "localhost",
                                   "metadata.annotations['batch.kubernetes.io/job-completion-index']":
                                   str(pod["index"])}[field]
        return kenv

    def _mounts(self, pod, c):
        """mountPath -> the local directory standing in for its volume: one
        per claim for a PersistentVolumeClaim (every pod that mounts it sees
        the same files, as with ReadWriteMany), else one per pod and volume.
        ConfigMap files are written with the container's mount paths in
        quotes replaced too (the job's training.checkpoint.dir)."""
        mounts = {}
        volumes = {v["name"]: v for v in pod["template"]["spec"].get("volumes", [])}
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            if "persistentVolumeClaim" in v:
                d = os.path.join(self.work, "pvc", v["persistentVolumeClaim"]["claimName"])
            else:
                d = os.path.join(self.work, pod["name"], m["name"])
            os.makedirs(d, exist_ok=True)
            mounts[m["mountPath"]] = d
        alt = "|".join(re.escape(mp) for mp in sorted(mounts, key=len, reverse=True))
        for m in c.get("volumeMounts", []):
            v, d = volumes.get(m["name"], {}), mounts[m["mountPath"]]
            if "configMap" in v:
                for key, data in self.configmaps[v["configMap"]["name"]]["data"].items():
                    data = re.sub(r'"(' + alt + r')(?=[/"])', lambda x: '"' + mounts[x.group(1)], data)
                    with open(os.path.join(d, key), "w") as f:
                        f.write(data)
            if "secret" in v:
                self.tls_secret(v["secret"]["secretName"], d)
        return mounts

    def _local(self, pod, kenv, mounts):
        """A function from a word of the pod's command line to the local one:
        $(VAR) expanded, mount paths -> their directories, the image's
        binaries -> the built ones, host:port -> 127.0.0.1 and the port of
        the pod that serves it."""
        alt = "|".join(re.escape(mp) for mp in sorted(mounts, key=len, reverse=True))

        def addr(m):
            host, port = m.group(1), int(m.group(2))
            if host in ("0.0.0.0", "[::]", ""):
                return "127.0.0.1:%d" % pod["ports"][port]
            return "127.0.0.1:%d" % self.resolve(host, port)

        def local(a):
            if os.path.dirname(a) == IMAGE_BIN_DIR:
                return binary(os.path.basename(a))
            a = re.sub(r"\$\((\w+)\)", lambda m: kenv[m.group(1)], a)
            if mounts:  # one pass: a replacement may itself start with a mount path
                a = re.sub(r"(^|=)(" + alt + r")(?=/|$)", lambda m: m.group(1) + mounts[m.group(2)], a)
            return re.sub(r"(?:(?<==)|^)([A-Za-z0-9][A-Za-z0-9.-]*|\[::\]):(\d+)$", addr, a)
        return local

    def _process(self, pod, words):
        """(argv, env) of `words` (command + args, or a hook's command) run
        as a local process of the pod."""
        c = pod["template"]["spec"]["containers"][0]
        kenv = self._kube_env(pod, c)
        local = self._local(pod, kenv, self._mounts(pod, c))
        env = clean_env()
        # Env values are what the process sees: a pod DNS name in one (a
        # hook reads it) resolves as it would in the cluster.
        env.update({k: local(v) if re.fullmatch(r"[a-z0-9.-]+:\d+", v) else v for k, v in kenv.items()})
        return [local(w) for w in words], env

    def command_line(self, pod):
        """(argv, env) of the pod's container, as a local process."""
        c = pod["template"]["spec"]["containers"][0]
        if os.path.dirname(c["command"][0]) != IMAGE_BIN_DIR:
            raise RuntimeError("%s runs %s, not a binary of the image" % (pod["name"], c["command"][0]))
        return self._process(pod, c["command"] + c.get("args", []))

    def pre_stop(self, pod):
        """(argv, env) of the container's preStop exec hook, or None."""
        c = pod["template"]["spec"]["containers"][0]
        hook = c.get("lifecycle", {}).get("preStop", {}).get("exec")
        return self._process(pod, hook["command"]) if hook else None

    def start(self, pod):
        argv, env = self.command_line(pod)
        log = os.path.join(self.work, pod["name"] + ".log")
        info("start %s: %s" % (pod["name"], " ".join(shlex.quote(a) for a in argv)))
        return self.procs.start(pod["name"], argv, env, log, cwd=os.path.join(self.work, pod["name"]))

    def delete(self, pod, p):
        """Deletes a running pod as the kubelet does: its preStop hook, then
        SIGTERM, then SIGKILL when terminationGracePeriodSeconds (counted
        from the start) runs out. Returns (hook exit code or None, the hook's
        output, the process's exit code)."""
        grace = pod["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        t0 = time.time()
        hook_code, hook_out = None, ""
        hook = self.pre_stop(pod)
        if hook is not None:
            argv, env = hook
            info("preStop %s: %s" % (pod["name"], " ".join(shlex.quote(a) for a in argv)))
            try:
                r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=grace, cwd=os.path.join(self.work, pod["name"]))
                hook_code, hook_out = r.returncode, r.stdout
            except subprocess.TimeoutExpired as e:
                hook_out = (e.stdout or b"").decode(errors="replace") + "\n(killed at the grace period)"
            info("preStop %s exited %s after %.1fs:\n%s" % (pod["name"], hook_code, time.time() - t0,
                                                           hook_out.strip()))
        # SIGTERM goes to the container's main process only (its children get
        # what it forwards); the kubelet gives it at least 2 s more after a
        # hook that used the grace period up; SIGKILL then ends them all.
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            code = p.wait(max(grace - (time.time() - t0), 2.0))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            code = p.wait()
        info("%s exited with %s, %.1fs after its deletion" % (pod["name"], code, time.time() - t0))
        return hook_code, hook_out, code


def final_evals(log_text):
    """rank -> (step, auc) of its last evaluation, from worker output."""
    evals = {}
    for m in re.finditer(r"recps-worker (\d+)\] eval after step (\d+): auc ([0-9.]+)", log_text):
        evals[int(m.group(1))] = (int(m.group(2)), float(m.group(3)))
    return evals


def job_steps(objs_or_text):
    m = re.search(r"^\s*steps:\s*(\d+)", objs_or_text, re.M)
    return int(m.group(1))


def scrape(port, timeout=2.0):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return None

