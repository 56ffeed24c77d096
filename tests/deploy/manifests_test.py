"""deploy_manifests: every overlay renders with every kubectl, validates,
lints and agrees with the binaries' flags (and with itself: the settings
docs/deploy.md says must agree)."""

import os
import re
import shutil
import subprocess
import tempfile

import testlib
from k8slib import (IMAGE_BIN_DIR, by_kind, flag_value, load_tools, need_yaml, pod_templates,
                    render, split_launch_args)
from testlib import binary, fail, info, skip

OVERLAYS = ["cpu", "gpu", "gpu-shards", "large", "monitoring"]
K8S_VERSION = "1.33.0"  # the Kubernetes API rendered objects are checked against

# The one line the job copies under deploy/k8s add to examples/ (the
# checkpoint volume's path; tests/deploy checks they differ in nothing else).
CHECKPOINT_LINE = re.compile(r'^  checkpoint \{ dir: "(/[^"]+)" every_steps: \d+ \}  # deploy/k8s: .*\n', re.M)
# The preStop hook of a shard server: a shell running recpsctl ($0) with
# the flags after it ($@), draining the address in SHARD_ADDRESS.
DRAIN_SCRIPT = 'exec "$0" drain "$SHARD_ADDRESS" "$@"'

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


def recpsctl_flags(command):
    """The flags `recpsctl COMMAND --help` names (recpsctl has no --helpfull)."""
    key = "recpsctl " + command
    if key not in _flags_cache:
        r = subprocess.run([binary("recpsctl"), command, "--help"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        _flags_cache[key] = set(re.findall(r"--([a-z0-9_]+)", r.stdout))
        if "coordinator" not in _flags_cache[key]:
            raise RuntimeError("no flags in recpsctl %s --help:\n%s" % (command, r.stdout))
    return _flags_cache[key]


def seconds(duration):
    """'100s', '2m', '1h' -> seconds."""
    m = re.fullmatch(r"(\d+)(s|m|h)", duration or "")
    if not m:
        raise RuntimeError("cannot read the duration %r" % duration)
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def pvc_mounts(o):
    """mountPath -> claim name of the PersistentVolumeClaim volumes the first
    container of o's pods mounts (volumeClaimTemplates: 'template:NAME')."""
    spec = o["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}
    claims.update({v["metadata"]["name"]: "template:" + v["metadata"]["name"]
                   for v in o["spec"].get("volumeClaimTemplates", [])})
    return {m["mountPath"]: claims[m["name"]] for m in spec["containers"][0].get("volumeMounts", [])
            if m["name"] in claims}


def check_checkpoints(overlay, objs, coord, shard):
    """The job checkpoints into a ReadWriteMany claim that the coordinator and
    every shard server mount at training.checkpoint.dir."""
    jobs = [d for c in by_kind(objs, "ConfigMap") for d in c.get("data", {}).values()]
    dirs = {m for text in jobs for m in CHECKPOINT_LINE.findall(text)}
    if len(dirs) != 1:
        fail("%s: the job sets no training.checkpoint line (or several): %s" % (overlay, sorted(dirs)))
        return
    ckpt_dir = dirs.pop()
    claims = set()
    for o in (coord, shard):
        found = [claim for path, claim in pvc_mounts(o).items()
                 if ckpt_dir == path or ckpt_dir.startswith(path.rstrip("/") + "/")]
        if not found:
            fail("%s: %s does not mount a PersistentVolumeClaim at training.checkpoint.dir %s"
                 % (overlay, o["metadata"]["name"], ckpt_dir))
        claims.update(found)
    if len(claims) != 1:
        fail("%s: the coordinator and the shard servers must share one checkpoint claim, not %s"
             % (overlay, sorted(claims)))
        return
    pvcs = {p["metadata"]["name"]: p for p in by_kind(objs, "PersistentVolumeClaim")}
    claim = claims.pop()
    if claim not in pvcs or "ReadWriteMany" not in pvcs[claim]["spec"].get("accessModes", []):
        fail("%s: the checkpoint claim %s is not a ReadWriteMany PersistentVolumeClaim of the manifests"
             % (overlay, claim))


def check_drain(overlay, objs, shard):
    """A shard pod's preStop drains its own server (the address it
    advertises) within terminationGracePeriodSeconds, and the disruption
    budget lets one go."""
    where = "%s: StatefulSet/recps-shard" % overlay
    pspec = shard["spec"]["template"]["spec"]
    c = pspec["containers"][0]
    cmd = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if cmd[:3] != ["/bin/sh", "-c", DRAIN_SCRIPT] or len(cmd) < 4 or \
            cmd[3] != os.path.join(IMAGE_BIN_DIR, "recpsctl"):
        fail("%s: the preStop hook is not [/bin/sh, -c, %s, %s/recpsctl, FLAGS...]: %s"
             % (where, DRAIN_SCRIPT, IMAGE_BIN_DIR, cmd))
        return
    flags = cmd[4:]
    known = recpsctl_flags("drain")
    for a in flags:
        if not a.startswith("--") or a[2:].split("=", 1)[0] not in known:
            fail("%s: preStop: `recpsctl drain --help` names no %s" % (where, a))
    if "--apply" not in flags:
        fail("%s: preStop: the drain plans without --apply and moves nothing" % where)
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    args = c.get("args", [])
    if flag_value(args, "advertise") != "$(SHARD_ADDRESS)" or \
            not (env.get("SHARD_ADDRESS") or "").startswith("$(POD_NAME)." + shard["spec"]["serviceName"] + ":"):
        fail("%s: --advertise must be $(SHARD_ADDRESS), a pod DNS name ($(POD_NAME).%s:PORT), "
             "the address the preStop drains" % (where, shard["spec"]["serviceName"]))
    mounted = {m["mountPath"] for m in c.get("volumeMounts", [])}
    for name in ("tls_ca", "tls_cert", "tls_key"):
        path = flag_value(flags, name) or ""
        if os.path.dirname(path) not in mounted:
            fail("%s: preStop: --%s=%s is not in a mounted volume" % (where, name, path))
    budget = seconds(flag_value(flags, "timeout")) + seconds(flag_value(args, "grace_period")) + 10
    if pspec.get("terminationGracePeriodSeconds", 30) < budget:
        fail("%s: terminationGracePeriodSeconds %s is under the drain's --timeout + --grace_period + 10s (%d)"
             % (where, pspec.get("terminationGracePeriodSeconds", 30), budget))
    for pdb in by_kind(objs, "PodDisruptionBudget"):
        if pdb["spec"]["selector"]["matchLabels"] == shard["spec"]["selector"]["matchLabels"] and \
                pdb["spec"].get("maxUnavailable") != 1:
            fail("%s: the shard servers' PodDisruptionBudget must allow one eviction at a time "
                 "(maxUnavailable: 1), not %s" % (overlay, pdb["spec"].get("maxUnavailable")))


def check_worker_restarts(overlay, job, nnodes):
    """Lost worker pods are replaced (a lost one fails all), with time to
    write the pre-emption checkpoint on SIGTERM."""
    where = "%s: Job/%s" % (overlay, job["metadata"]["name"])
    if job["spec"].get("backoffLimit", 6) < nnodes:
        fail("%s: backoffLimit %s is under the %d pods one lost worker fails" % (
            where, job["spec"].get("backoffLimit"), nnodes))
    if job["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) < 120 + 10:
        fail("%s: terminationGracePeriodSeconds is under recps launch's --stop_timeout (2m) + 10s" % where)
    codes = [r for r in job["spec"].get("podFailurePolicy", {}).get("rules", [])
             if r["action"] == "FailJob" and r.get("onExitCodes", {}).get("operator") == "In"]
    if not codes or set(codes[0]["onExitCodes"]["values"]) != {2, 3}:
        fail("%s: podFailurePolicy must fail the Job on exit codes 2 and 3 (not worth a restart)" % where)


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
    if flag_value(c_args, "world_size") != flag_value(s_args, "world_size"):
        fail("%s: coordinator --world_size=%s but shard --world_size=%s" % (
            overlay, flag_value(c_args, "world_size"), flag_value(s_args, "world_size")))
    check_checkpoints(overlay, objs, coord, shard)
    check_drain(overlay, objs, shard)
    check_worker_restarts(overlay, job, nnodes)

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
    if overlay in ("overlays/gpu", "overlays/gpu-shards"):
        wc = job["spec"]["template"]["spec"]["containers"][0]
        if str(wc["resources"].get("limits", {}).get("nvidia.com/gpu")) != "1":
            fail("%s: worker pods must ask for one nvidia.com/gpu" % overlay)
        if not any(e["name"].startswith("NCCL_") for e in wc.get("env", [])):
            fail("%s: no NCCL settings in the worker env" % overlay)
        # The pod's GPU is CUDA device 0 in the container; auto would look
        # for /dev/nvidia0, which may not be there.
        if flag_value(launch, "gpus") != "0":
            fail("%s: the workers must run with --gpus=0, not --gpus=%s" % (overlay, flag_value(launch, "gpus")))
    sc = shard["spec"]["template"]["spec"]["containers"][0]
    on_gpu = str(sc["resources"].get("limits", {}).get("nvidia.com/gpu", "0")) != "0"
    if overlay == "overlays/gpu-shards" and not on_gpu:
        fail("%s: shard server pods must ask for one nvidia.com/gpu" % overlay)
    if on_gpu != (flag_value(s_args, "device") or "cpu").startswith("cuda"):
        fail("%s: shard servers with %s GPU run --device=%s" % (
            overlay, "a" if on_gpu else "no", flag_value(s_args, "device")))
    if on_gpu and flag_value(s_args, "device") != "cuda:0":
        fail("%s: a shard server's GPU is cuda:0 in its container, not %s" % (overlay, flag_value(s_args, "device")))
    if overlay == "overlays/monitoring":
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
        text = open(os.path.join(testlib.SRC, copy)).read()
        if len(CHECKPOINT_LINE.findall(text)) != 1 or \
                CHECKPOINT_LINE.sub("", text) != open(os.path.join(testlib.SRC, orig)).read():
            fail("%s is not a copy of %s plus one training.checkpoint line (%s): "
                 "cp %s %s and add the line again" % (copy, orig, CHECKPOINT_LINE.pattern, orig, copy))
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
            testlib.partly_skipped.append("kubernetes-validate and yamllint: " + tools["VENV_WHY"])
        else:
            lint = os.path.join(os.path.dirname(tools["VENV_PYTHON"]), "yamllint")
            r = subprocess.run([lint, "--strict", "-c", os.path.join(testlib.SRC, "deploy/.yamllint"),
                                os.path.join(testlib.SRC, "deploy")], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                fail("yamllint:\n" + r.stdout)
            else:
                info("yamllint: clean")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

