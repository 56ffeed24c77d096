#!/usr/bin/python3
"""A cluster over several "hosts" on this machine: network namespaces joined
by veth pairs to a bridge, the coordinator, two shard servers and two worker
nodes (`recps launch --nnodes=2`) each on its own host.

  multihost_test.py SOURCE_DIR BUILD_DIR

1. train: the small job for a fixed number of steps across the hosts; rank
   0's held-out AUC is the one `recps local` gives with the same steps;
2. cut: a longer run, shard server 1's link set down mid-run: a worker
   reports the unreachable server within NOTICE_BOUND_S (keepalive pings,
   not the RPC deadline) and the launchers exit non-zero within CUT_BOUND_S;
3. tbf: the same short run unlimited, then with shard server 0's link
   limited both ways by `tc qdisc ... tbf` to each of TBF_RATES: the
   workers' lookup + push time per step (their `done:` line) grows with
   every cut in the rate by TBF_MIN_FACTOR at least.

4. partition: three shard servers with replication 2 (the coordinator's
   lease 2 s); mid-run shard server 1 loses its route to the coordinator
   only (a blackhole route in its namespace: the workers and the other
   servers still reach it). Its lease lapses, it fences itself, the
   coordinator fails it over, and the job goes on to the end: the
   launchers exit 0 and rank 0's final AUC is the one `recps local` gives
   with the same steps (a sync run is bit-identical whatever the servers).

RECPS_MULTIHOST_ONLY=train,cut,tbf,partition picks the parts (default: all).

Needs root (CAP_NET_ADMIN), `ip` and `tc`; exits 77 (ctest: skipped) saying
why when a namespace cannot be made. Every namespace it makes is deleted and
every process it starts is stopped, however it ends.
"""

import atexit
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import testlib
from testlib import (MIN_AUC, binary, clean_env, fail, failures, info,
                     skip, tail, wait_for)

TRAIN_STEPS = 600
TBF_STEPS = 40
TBF_RATES = ["80mbit", "20mbit"]  # each step's lookup + push must grow with
TBF_MIN_FACTOR = 2.0               # each cut in the rate, by this factor at least
CUT_BOUND_S = 120.0   # the launchers must fail this soon after the cut
NOTICE_BOUND_S = 10.0  # a worker must report the dead server this soon (keepalive; 67 s at the RPC deadline before)
SUBNET = "10.213.0"
COORD_PORT, SHARD_PORT = 7000, 7100
HOSTS = ["coord", "shard0", "shard1", "shard2", "node0", "node1"]  # 10.213.0.1 .. .6
PARTITION_STEPS = 1500
PARTITION_BOUND_S = 240.0  # the partitioned run must end this soon after the cut

SRC = BUILD = None


def sh(*argv, check=True):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stdout.strip()))
    return r


# --------------------------------------------------------------- the network

class Network:
    """HOSTS as namespaces recps-<pid>-<host>, each with eth0 = SUBNET.<i+1>,
    its veth peer on a bridge in namespace recps-<pid>-sw. Deleted (with
    whatever still runs in them) at exit or on a signal."""

    def __init__(self):
        self.prefix = "recps-%d-" % os.getpid()
        self.made = []
        atexit.register(self.delete)
        self.switch = self.prefix + "sw"
        r = sh("ip", "netns", "add", self.switch, check=False)
        if r.returncode != 0:
            skip("cannot create a network namespace (needs root / CAP_NET_ADMIN): "
                 "`ip netns add %s`: %s" % (self.switch, r.stdout.strip()))
        self.made.append(self.switch)
        sw = ["ip", "-n", self.switch]
        sh(*sw, "link", "set", "lo", "up")
        sh(*sw, "link", "add", "br0", "type", "bridge")
        sh(*sw, "link", "set", "br0", "up")
        for i, host in enumerate(HOSTS):
            ns = self.ns(host)
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            port = "p%d" % i  # the switch's end of the host's link
            sh(*sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh(*sw, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", "%s/24" % self.addr(host), "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        info("network: bridge in %s; %s" % (self.switch, ", ".join(
            "%s=%s" % (self.ns(h), self.addr(h)) for h in HOSTS)))

    def ns(self, host):
        return self.prefix + host

    @staticmethod
    def addr(host):
        return "%s.%d" % (SUBNET, HOSTS.index(host) + 1)

    def switch_port(self, host):
        return "p%d" % HOSTS.index(host)

    def kill_inside(self):
        for ns in self.made:
            r = sh("ip", "netns", "pids", ns, check=False)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def delete(self):
        self.kill_inside()
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns, check=False)
        self.made = []


# --------------------------------------------------------------- processes

class Processes:
    """Children in their own sessions; all stopped at exit or on a signal."""

    def __init__(self, net):
        self.net = net
        self.procs = []
        atexit.register(self.stop_all)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        self.stop_all()
        self.net.delete()
        sys.exit(128 + signum)

    def start(self, host, name, argv, log):
        out = open(log, "wb")
        p = subprocess.Popen(["ip", "netns", "exec", self.net.ns(host)] + argv, env=clean_env(),
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             cwd=SRC, start_new_session=True)
        out.close()
        self.procs.append((name, p, log))
        return p

    @staticmethod
    def stop(p, grace=5.0):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return p.wait()

    def stop_all(self):
        for _, p, _ in reversed(self.procs):
            self.stop(p)
        self.procs = []


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def final_evals(text):
    """rank -> (step, auc) of its last evaluation, from worker output."""
    evals = {}
    for m in re.finditer(r"recps-worker (\d+)\] eval after step (\d+): auc ([0-9.]+)", text):
        evals[int(m.group(1))] = (int(m.group(2)), float(m.group(3)))
    return evals


def done_split(text):
    """rank -> {phase: ms per step} from the workers' `done:` lines."""
    out = {}
    for m in re.finditer(r"recps-worker (\d+)\] done: .*?per step: (.*)", text):
        phases = m.group(2).replace("waiting for overlapped lookups", "wait")
        out[int(m.group(1))] = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+) ms", phases)}
    return out


class Cluster:
    """One coordinator, `shards` shard servers (two by default) and two
    `recps launch` nodes, each on its own host; a fresh state per run."""

    def __init__(self, net, procs, work, name, shards=2, replication=1):
        self.net, self.procs = net, procs
        self.shards, self.replication = shards, replication
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        self.coordinator = "%s:%d" % (net.addr("coord"), COORD_PORT)
        self.servers, self.launchers = [], []

    def log(self, who):
        return os.path.join(self.dir, who + ".log")

    def start(self, worker_flags):
        job = os.path.join(SRC, "examples/small.textproto")
        port_file = os.path.join(self.dir, "coordinator.port")
        c = self.procs.start("coord", "coordinator", [
            binary("recps-coordinator"), "--job=" + job, "--num_shards=%d" % self.shards,
            "--world_size=2", "--listen=0.0.0.0:%d" % COORD_PORT, "--metrics_listen=127.0.0.1:0",
            "--state_dir=" + os.path.join(self.dir, "coordinator"), "--port_file=" + port_file,
            "--insecure"] + (["--replication=%d" % self.replication, "--lease=2s"]
                             if self.replication > 1 else []),
            self.log("coordinator"))
        self.servers.append(("coordinator", c))
        wait_for("the coordinator's port file", lambda: read(port_file).strip(), 30, self.servers)
        for i in range(self.shards):
            host = "shard%d" % i
            addr = "%s:%d" % (self.net.addr(host), SHARD_PORT)
            s = self.procs.start(host, host, [
                binary("recps-shard"), "--job=" + job, "--world_size=2",
                "--coordinator=" + self.coordinator, "--listen=0.0.0.0:%d" % SHARD_PORT,
                "--advertise=" + addr, "--metrics_listen=127.0.0.1:0", "--insecure"], self.log(host))
            self.servers.append((host + " (" + addr + ")", s))
        for k in range(2):
            host = "node%d" % k
            p = self.procs.start(host, "launcher " + host, [
                binary("recps"), "launch", "--nproc-per-node=1", "--nnodes=2",
                "--node-rank=%d" % k, "--coordinator=" + self.coordinator, "--gpus=none",
                "--insecure", "--"] + worker_flags, self.log(host))
            self.launchers.append((host, p))

    def text(self):
        return "".join(read(self.log(h)) for h, _ in self.launchers)

    def wait(self, timeout):
        """Exit codes of the launchers (None: still running at the deadline)."""
        deadline = time.time() + timeout
        while time.time() < deadline and any(p.poll() is None for _, p in self.launchers):
            for name, p in self.servers:
                if p.poll() is not None:
                    raise RuntimeError("%s exited with %s:\n%s" % (
                        name, p.returncode, tail(self.log(name.split()[0]))))
            time.sleep(0.1)
        return [p.poll() for _, p in self.launchers]

    def stop(self):
        for _, p in self.launchers + self.servers:
            Processes.stop(p)


# -------------------------------------------------------------------- runs

def local_auc(work, steps):
    """Rank 0's final AUC from `recps local` (127.0.0.1, same job and steps)."""
    r = subprocess.run([binary("recps"), "local", "--steps=%d" % steps,
                        "--work_dir=" + os.path.join(work, "local-%d" % steps), "--", "--threads=1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=SRC,
                       env=clean_env(), timeout=300)
    evals = final_evals(r.stdout)
    if r.returncode != 0 or 0 not in evals:
        raise RuntimeError("recps local --steps=%d failed (%d):\n%s" % (steps, r.returncode, r.stdout[-3000:]))
    return evals[0]


def run_train(net, procs, work):
    cl = Cluster(net, procs, work, "train")
    t0 = time.time()
    cl.start(["--steps=%d" % TRAIN_STEPS, "--threads=1"])
    try:
        codes = cl.wait(240)
    finally:
        cl.stop()
    text = cl.text()
    if codes != [0, 0]:
        fail("train: launchers exited with %s:\n%s\n%s" % (codes, tail(cl.log("node0")), tail(cl.log("node1"))))
        return
    evals = final_evals(text)
    info("train: %d steps across the hosts in %.1fs; final evaluations (rank: step, auc): %s"
         % (TRAIN_STEPS, time.time() - t0, evals))
    if sorted(evals) != [0, 1]:
        fail("train: expected evaluations from ranks 0 and 1, got %s" % sorted(evals))
        return
    for rank, (step, auc) in evals.items():
        if step != TRAIN_STEPS or auc < MIN_AUC:
            fail("train: rank %d: last evaluation after step %d with auc %.4f (want step %d, auc >= %.2f)"
                 % (rank, step, auc, TRAIN_STEPS, MIN_AUC))
    step, auc = local_auc(work, TRAIN_STEPS)
    info("train: recps local --steps=%d: rank 0 auc %.4f; across the hosts: %.4f" % (TRAIN_STEPS, auc, evals[0][1]))
    if (step, auc) != evals[0]:
        fail("train: rank 0's final evaluation across the hosts %s differs from recps local's %s"
             % (evals[0], (step, auc)))


def run_cut(net, procs, work):
    cl = Cluster(net, procs, work, "cut")
    cl.start(["--steps=100000", "--threads=1", "--progress_every=0.5s"])
    try:
        wait_for("training progress on node0", lambda: re.search(r"\] step \d+/", read(cl.log("node0"))),
                 120, cl.launchers)
        victim = "%s:%d" % (net.addr("shard1"), SHARD_PORT)
        sh("ip", "-n", net.ns("shard1"), "link", "set", "eth0", "down")
        t_cut = time.time()
        info("cut: shard1's link (eth0 in %s, server %s) set down" % (net.ns("shard1"), victim))
        exited = {}
        while time.time() < t_cut + CUT_BOUND_S and len(exited) < 2:
            for host, p in cl.launchers:
                if host not in exited and p.poll() is not None:
                    exited[host] = (p.returncode, time.time() - t_cut)
            time.sleep(0.1)
        text = cl.text()
        info("cut: launchers after the cut: %s" % (
            {h: "exit %d after %.1fs" % e for h, e in exited.items()} or "none exited"))
        errors = [l for l in text.splitlines() if re.search(r"\b(E\d{4}|ERROR|error|failed)\b", l)]
        info("cut: error lines:\n  " + "\n  ".join(errors[-12:]))
        if len(exited) < 2:
            fail("cut: %s still running %.0fs after shard1's link went down:\n%s" % (
                [h for h, _ in cl.launchers if h not in exited], CUT_BOUND_S, tail(cl.log("node0"), 15)))
        for host, (code, _) in exited.items():
            if code == 0:
                fail("cut: the launcher on %s exited 0 after the cut" % host)
        # The first rank to fail names the server; the other may fail on the
        # allreduce its peer left (`Connection closed by peer`) first.
        named = [l for l in text.splitlines() if "training failed" in l and victim in l]
        if not named:
            fail("cut: no worker's `training failed` line names the unreachable server %s" % victim)
        # Noticed by keepalive pings, not at the RPC deadline: the first such
        # line's own timestamp (UTC, the log's) against the cut.
        stamps = [datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ")
                  .replace(tzinfo=datetime.timezone.utc).timestamp()
                  for m in (re.match(r"(\d{4}-\d\d-\d\dT[\d:.]+Z)", l) for l in named) if m]
        if not stamps:
            fail("cut: cannot read the time of the `training failed` lines:\n  " + "\n  ".join(named))
        noticed = min(stamps) - t_cut
        info("cut: the first worker reported %s %.1fs after the cut" % (victim, noticed))
        if noticed > NOTICE_BOUND_S:
            fail("cut: the dead server was reported %.1fs after the cut (bound %.0fs)" % (noticed, NOTICE_BOUND_S))
    finally:
        cl.stop()
        sh("ip", "-n", net.ns("shard1"), "link", "set", "eth0", "up", check=False)


def run_partition(net, procs, work):
    cl = Cluster(net, procs, work, "partition", shards=3, replication=2)
    cl.start(["--steps=%d" % PARTITION_STEPS, "--threads=1", "--progress_every=0.5s"])
    victim = "%s:%d" % (net.addr("shard1"), SHARD_PORT)
    try:
        wait_for("training progress on node0", lambda: re.search(r"\] step \d+/", read(cl.log("node0"))),
                 120, cl.launchers)
        # Shard server 1 can no longer reach the coordinator, nor answer it;
        # the workers and the other shard servers still reach it.
        sh("ip", "-n", net.ns("shard1"), "route", "add", "blackhole", "%s/32" % net.addr("coord"))
        t_cut = time.time()
        info("partition: %s cut from the coordinator %s" % (victim, cl.coordinator))
        codes = cl.wait(PARTITION_BOUND_S)
        took = time.time() - t_cut
    finally:
        cl.stop()
        sh("ip", "-n", net.ns("shard1"), "route", "del", "blackhole", "%s/32" % net.addr("coord"),
           check=False)
    coordinator_log = read(cl.log("coordinator"))
    failover = [l for l in coordinator_log.splitlines() if "failover: shard server " + victim in l]
    info("partition: launchers exited %s %.1fs after the cut; coordinator: %s"
         % (codes, took, failover[0] if failover else "no failover line"))
    if codes != [0, 0]:
        fail("partition: the launchers exited with %s:\n%s\n%s" % (
            codes, tail(cl.log("node0")), tail(cl.log("node1"))))
        return
    if not failover:
        fail("partition: the coordinator did not fail %s over:\n%s" % (victim, tail(cl.log("coordinator"))))
    if "lease lapsed" not in read(cl.log("shard1")):
        fail("partition: shard1 did not fence itself (no `lease lapsed` in its log):\n%s"
             % tail(cl.log("shard1")))
    evals = final_evals(cl.text())
    step, auc = local_auc(work, PARTITION_STEPS)
    info("partition: rank 0's final evaluation %s; recps local --steps=%d: %s"
         % (evals.get(0), PARTITION_STEPS, (step, auc)))
    if evals.get(0) != (step, auc):
        fail("partition: rank 0's final evaluation %s differs from recps local's %s"
             % (evals.get(0), (step, auc)))


def run_tbf(net, procs, work):
    """Lookup + push ms per step (averaged over the ranks) unlimited, then with
    shard0's link limited both ways to each of TBF_RATES."""
    links = ((net.ns("shard0"), "eth0"), (net.switch, net.switch_port("shard0")))
    results = []
    for rate in [None] + TBF_RATES:
        name = "tbf " + rate if rate else "tbf unlimited"
        if rate:
            for ns, dev in links:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                   "rate", rate, "burst", "32kbit", "latency", "50ms")
        cl = Cluster(net, procs, work, name.replace(" ", "-"))
        t0 = time.time()
        cl.start(["--steps=%d" % TBF_STEPS, "--threads=1"])
        try:
            codes = cl.wait(150)
        finally:
            cl.stop()
        split = done_split(cl.text())
        if codes != [0, 0] or sorted(split) != [0, 1]:
            fail("%s: launchers exited with %s:\n%s" % (name, codes, tail(cl.log("node0"))))
            break
        lp = sum(s["lookup"] + s["push"] for s in split.values()) / 2
        info("%s: %d steps in %.1fs; ms per step, rank 0: %s; rank 1: %s; lookup+push %.2f ms" % (
            name, TBF_STEPS, time.time() - t0, split[0], split[1], lp))
        results.append((rate or "unlimited", lp))
    for ns, dev in links:
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
    info("tbf: lookup+push per step with shard0's link at " +
         ", ".join("%s: %.2f ms" % r for r in results))
    for (r0, a), (r1, b) in zip(results, results[1:]):
        if b < TBF_MIN_FACTOR * a:
            fail("tbf: lookup+push per step %.2f ms at %s, %.2f ms at %s: want x%.1f at least"
                 % (a, r0, b, r1, TBF_MIN_FACTOR))


def main():
    global SRC, BUILD
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    SRC, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    testlib.BUILD = BUILD
    t0 = time.time()
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            skip("`%s` (iproute2) is not installed" % tool)
    net = Network()
    procs = Processes(net)
    work = tempfile.mkdtemp(prefix="recps-multihost-")
    only = os.environ.get("RECPS_MULTIHOST_ONLY", "train,cut,tbf,partition").split(",")
    try:
        for part, fn in (("train", run_train), ("cut", run_cut), ("tbf", run_tbf),
                         ("partition", run_partition)):
            if part in only:
                try:
                    fn(net, procs, work)
                except RuntimeError as e:
                    fail("%s: %s" % (part, e))
                procs.stop_all()
                net.kill_inside()
    finally:
        procs.stop_all()
        net.delete()
        if not failures:
            shutil.rmtree(work, ignore_errors=True)
        else:
            info("logs kept in " + work)
    verdict, code = ("FAILED (%d)" % len(failures), 1) if failures else ("passed", 0)
    info("multihost: %s in %.1fs" % (verdict, time.time() - t0))
    return code


if __name__ == "__main__":
    sys.exit(main())
