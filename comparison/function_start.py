#!/usr/bin/env python3
"""The reference function's size and cold start (make bench-function).

Cold start here is what Lambda bills as init for a custom runtime: from
spawning the binary to its first request for an event
(`GET /2018-06-01/runtime/invocation/next`), against a stub of the Lambda
Runtime API on 127.0.0.1. The binaries given are started in turn, RUNS
times each, interleaved; with BENCH_DROP_CACHES=1 (root only) the page
cache is dropped before each start, so the binary is read from disk as in
a new execution environment.

    comparison/function_start.py LABEL=PATH [LABEL=PATH ...]
"""
import http.server
import os
import statistics
import subprocess
import sys
import threading
import time

RUNS = int(os.environ.get("BENCH_RUNS", "30"))


class RuntimeApi(http.server.BaseHTTPRequestHandler):
    """Records when the function first asks for an event, then answers 500
    so that it stops (it is killed anyway)."""

    first_request = None

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        if RuntimeApi.first_request is None:
            RuntimeApi.first_request = time.perf_counter()
        self.send_response(500)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):  # noqa: N802
        self.do_GET()

    def log_message(self, *args):
        pass


def drop_caches():
    if os.environ.get("BENCH_DROP_CACHES") != "1":
        return
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as caches:
        caches.write("3\n")


def start_once(path, port):
    env = dict(os.environ, AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{port}", AWS_REGION="us-east-1",
               AWS_ACCESS_KEY_ID="stub", AWS_SECRET_ACCESS_KEY="stub", AWS_LAMBDA_FUNCTION_NAME="charges",
               AWS_LAMBDA_FUNCTION_VERSION="1", AWS_LAMBDA_FUNCTION_MEMORY_SIZE="128",
               CHARGES_TABLE="charges", IDEMPOTENCY_TABLE="idempotency")
    env.pop("IDEMPOTENCY_STORE_URL", None)
    drop_caches()
    RuntimeApi.first_request = None
    started = time.perf_counter()
    process = subprocess.Popen([path], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = started + 10
        while RuntimeApi.first_request is None and time.perf_counter() < deadline:
            time.sleep(0.0002)
        if RuntimeApi.first_request is None:
            raise RuntimeError(f"{path} never asked for an event")
        return (RuntimeApi.first_request - started) * 1000
    finally:
        process.kill()
        process.wait()


def main():
    binaries = [argument.split("=", 1) for argument in sys.argv[1:]]
    if not binaries or any(len(pair) != 2 for pair in binaries):
        sys.exit(__doc__)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RuntimeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    for _, path in binaries:
        start_once(path, port)  # discarded: the first start warms the system up
    times = {label: [] for label, _ in binaries}
    for _ in range(RUNS):
        for label, path in binaries:
            times[label].append(start_once(path, port))
    server.shutdown()
    caches = "page cache dropped before each start" if os.environ.get("BENCH_DROP_CACHES") == "1" else "page cache warm"
    print(f"\nreference function, {RUNS} starts each, interleaved ({caches}):")
    print("| build | size (MB) | cold start to first event request, median / p90 (ms) |")
    print("|---|---|---|")
    for label, path in binaries:
        values = sorted(times[label])
        p90 = values[int(len(values) * 0.9) - 1]
        print(f"| {label} | {os.path.getsize(path) / 1e6:.1f} | {statistics.median(values):.1f} / {p90:.1f} |")


if __name__ == "__main__":
    main()
