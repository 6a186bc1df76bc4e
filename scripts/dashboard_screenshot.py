#!/usr/bin/env python3
"""make dashboard-screenshot: the Grafana dashboard's panels with the metrics
of a real run, looked at in a browser.

1. Builds and starts the Prometheus example server (examples/prometheus.rs:
   axum, the HTTP layer on the memory store, observe::Metrics, /metrics).
2. Starts Prometheus (Debian's package) scraping it every second.
3. Sends DASHBOARD_SECONDS (default 90) of traffic over HTTP: new charges
   from four clients, retries replayed (more of them in the middle third, a
   retry storm), duplicates sent while the first runs (answered 409 after
   the layer's 200 ms wait), keys reused with another body (422), and
   charges that outlive their 2 s lease, taken over by a retry (and a second
   takeover every other time).
4. Serves dashboards/ and has headless Chromium (Debian's, driven by
   playwright-core) open dashboards/render/index.html, which draws each
   panel of dashboards/grafana/idempotency.json from Prometheus's HTTP API;
   writes the screenshot to target/dashboard/idempotency.png (DASHBOARD_OUT)
   and fails unless every panel drew data.

Everything it starts is stopped on the way out, pass or fail.
"""

import collections
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = int(os.environ.get("DASHBOARD_SECONDS", "90"))
OUT = os.path.abspath(os.environ.get("DASHBOARD_OUT", os.path.join(ROOT, "target", "dashboard", "idempotency.png")))
CARGO = os.environ.get("CARGO", "cargo")
LEASE_S = 2.0  # the example's default_lease
WAIT_S = 0.2  # the example's wait_for_result


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url, what, process, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer {url} in {seconds} s")


def build_server():
    """The example's executable, built now (wherever CARGO_TARGET_DIR is)."""
    output = subprocess.run(
        [CARGO, "build", "--example", "prometheus", "--features", "axum,metrics",
         "--message-format=json-render-diagnostics"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout
    for line in output.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message["target"]["name"] == "prometheus" \
                and "example" in message["target"]["kind"] and message.get("executable"):
            return message["executable"]
    raise RuntimeError("cargo built no prometheus example")


class Traffic:
    """Clients of the example server, each on its own thread, counting the
    statuses they get."""

    def __init__(self, port, seconds):
        self.port = port
        self.seconds = seconds
        self.start = time.monotonic()
        self.statuses = collections.Counter()
        self.lock = threading.Lock()
        self.keys = 0
        self.random = random.Random(58)

    def key(self):
        with self.lock:
            self.keys += 1
            return f"k{self.keys}"

    def running(self):
        return time.monotonic() - self.start < self.seconds

    def phase(self):
        """Where in the run we are, 0 to 1."""
        return min(1.0, (time.monotonic() - self.start) / self.seconds)

    def post(self, key, body):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("POST", "/v1/charges", body=json.dumps(body),
                               headers={"idempotency-key": key, "content-type": "application/json"})
            answer = connection.getresponse()
            answer.read()
            status = answer.status
        finally:
            connection.close()
        with self.lock:
            self.statuses[status] += 1
        return status

    def later(self, seconds, action):
        thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
        thread.start()
        return thread

    def client(self, seed):
        """New charges, some retried once the answer came (a replay): more
        retries in the middle third of the run."""
        rng = random.Random(seed)
        while self.running():
            key = self.key()
            body = {"amount": rng.randint(100, 99_000), "work_ms": rng.randint(5, 60)}
            self.post(key, body)
            storm = 1 / 3 < self.phase() < 2 / 3
            if rng.random() < (0.6 if storm else 0.15):
                self.post(key, body)
            time.sleep(rng.uniform(0.02, 0.08))

    def duplicates(self):
        """A duplicate while the first request runs: it waits, then 409;
        retried after the first ended, a replay."""
        while self.running():
            key = self.key()
            work_ms = self.random.randint(400, 900)
            body = {"amount": 1250, "work_ms": work_ms}
            first = self.later(0, lambda: self.post(key, body))
            time.sleep(self.random.uniform(0.05, (work_ms / 1000) - WAIT_S - 0.05))
            self.post(key, body)
            first.join()
            self.post(key, body)
            time.sleep(self.random.uniform(0.5, 1.5))

    def reused(self):
        """A key sent again with another body: 422."""
        while self.running():
            key = self.key()
            self.post(key, {"amount": 100})
            self.post(key, {"amount": 200})
            time.sleep(self.random.uniform(1.5, 3.5))

    def takeovers(self):
        """A charge that outlives its lease: the retry sent after the lease
        takes it over (the first run's lease is lost); every other time a
        third send takes over the retry too."""
        round_ = 0
        while self.running():
            round_ += 1
            key = self.key()
            body = {"amount": 5000, "work_ms": 2600}
            sends = [self.later(0, lambda: self.post(key, body)),
                     self.later(LEASE_S + 0.2, lambda: self.post(key, body))]
            if round_ % 2 == 0:
                sends.append(self.later(2 * LEASE_S + 0.5, lambda: self.post(key, body)))
            for send in sends:
                send.join()
            time.sleep(self.random.uniform(1, 4))

    def run(self):
        threads = [threading.Thread(target=self.client, args=(seed,)) for seed in range(4)]
        threads += [threading.Thread(target=work) for work in (self.duplicates, self.reused, self.takeovers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def main():
    for tool in ("prometheus", "node"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (make dashboard-screenshot installs it)")
    server_exe = build_server()
    work = tempfile.mkdtemp(prefix="dashboard-screenshot.")
    processes = []

    def start(command, log):
        process = subprocess.Popen(command, cwd=ROOT, stdout=open(os.path.join(work, log), "w"),
                                   stderr=subprocess.STDOUT)
        processes.append(process)
        return process

    try:
        server_port, prometheus_port, page_port = free_port(), free_port(), free_port()
        server = start([server_exe, f"127.0.0.1:{server_port}"], "server.log")
        wait_for(f"http://127.0.0.1:{server_port}/metrics", "the example server", server)

        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: charges\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{server_port}']\n")
        prometheus = start(["prometheus", f"--config.file={config}",
                            f"--storage.tsdb.path={os.path.join(work, 'data')}",
                            f"--web.listen-address=127.0.0.1:{prometheus_port}"], "prometheus.log")
        wait_for(f"http://127.0.0.1:{prometheus_port}/-/ready", "Prometheus", prometheus)

        print(f"traffic for {SECONDS} s against the example server on 127.0.0.1:{server_port}, "
              f"scraped every second by Prometheus on 127.0.0.1:{prometheus_port}", flush=True)
        began = time.time()
        traffic = Traffic(server_port, SECONDS)
        traffic.run()
        time.sleep(3)  # the last scrapes
        ended = time.time()
        print("statuses:", dict(sorted(traffic.statuses.items())), flush=True)

        page = start([sys.executable, "-m", "http.server", str(page_port), "--bind", "127.0.0.1",
                      "--directory", os.path.join(ROOT, "dashboards")], "page.log")
        wait_for(f"http://127.0.0.1:{page_port}/render/index.html", "the page server", page)
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        url = (f"http://127.0.0.1:{page_port}/render/index.html?prometheus=http://127.0.0.1:{prometheus_port}"
               f"&start={int(began) - 5}&end={int(ended)}&step=1&rate=15s")
        shot = subprocess.run(["node", os.path.join(ROOT, "dashboards", "render", "shoot.mjs"), url, OUT], cwd=ROOT)
        if shot.returncode != 0:
            sys.exit(f"the dashboard did not render with data on every panel (logs in {work})")
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
