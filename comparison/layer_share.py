"""The layer's own CPU per new request at the server, by call chain.

A server's CPU over the bare app's moves by more from round to round than
a change to the layer (BENCHMARKS.md's pass of 2026-11-26, "The layer's
CPU, a third pass", in `git log -p BENCHMARKS.md`). This measures the
layer's share of one server's CPU instead:

1. starts `server-bench run` for the memory server alone (new keys, then
   replays), at BENCH_RATE requests a second (default 20000);
2. records its server process under the new-key load with
   `perf record -g --call-graph fp` (the binary must keep frame pointers:
   `make bench-server-share` builds it so);
3. counts a sample as the layer's when its stack passes through the
   crate's code (or the request span's `Instrumented` wrapper, into which
   the compiler inlines it) and not through the handler's, and groups
   those by what they were doing;
4. prints each group's share times the server's CPU per request.

Usage: python3 comparison/layer_share.py <server-bench binary> [runs]
Needs `perf` and permission to record another process.
"""

import os
import re
import subprocess
import sys
import tempfile
import time

# Checked in order: a sample goes to the first group one of its frames
# matches.
GROUPS = [
    ("the canonical writer (fingerprint)", r"fingerprint::streaming::Writer|streaming::written|from_utf8"),
    ("SHA-256, hex, the request's head (fingerprint)", r"sha2::|lower_hex|fingerprint::|Head::of"),
    ("the owner token (getrandom)", r"getrandom|OwnerToken"),
    ("the memory store", r"store::memory|hashbrown"),
    ("the response's encoding for its record", r"ResponseCodec|http::stored"),
    ("the body read", r"buffer_request|read_bounded"),
    ("the key, the scope, the headers", r"parse_key|read_header_key|scope::|grpc_wire|RecordId::new"),
]
LAYER = re.compile(r"lambda_idempotency|tracing::instrument::Instrumented")
HANDLER = re.compile(r"axum::handler::Handler|Json<T>::from_bytes")
ALLOCATOR = re.compile(r"malloc|free|_int_|unlink_chunk|__rust_(alloc|dealloc)")


def record(binary, rate, data):
    """Runs the memory server under load, records it, and returns its CPU
    per new request (us, under perf)."""
    env = dict(os.environ, BENCH_VARIANTS="memory", BENCH_ROUNDS="1", BENCH_SECONDS="7")
    env["BENCH_RATE"] = str(rate)
    run = subprocess.Popen([binary, "run"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # The warm-up round (1 s of new keys, 1 s of replays), then the
    # counted new-key run: recorded from 2.5 s into it.
    time.sleep(4.5)
    servers = subprocess.run(["pgrep", "-n", "-f", "serve memory"], capture_output=True, text=True).stdout.split()
    if not servers:
        run.kill()
        sys.exit("the memory server did not start")
    subprocess.run(
        ["perf", "record", "-q", "-g", "--call-graph", "fp", "-p", servers[0], "-o", data, "--", "sleep", "4"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out, _ = run.communicate()
    row = next(line for line in out.splitlines() if line.startswith("| memory | distinct"))
    return float(row.split("|")[5])


def stacks(data):
    """Each sample's stack, innermost frame first."""
    script = subprocess.run(
        ["perf", "script", "-i", data, "-F", "ip,sym", "--no-inline"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    frames = []
    for line in script.splitlines():
        line = line.strip()
        if line:
            frames.append(line.split(" ", 1)[1] if " " in line else line)
        elif frames:
            yield frames
            frames = []
    if frames:
        yield frames


def share(data):
    """The samples in all, and the layer's by group."""
    total = 0
    groups = {}
    for frames in stacks(data):
        total += 1
        chain = " | ".join(frames)
        if not LAYER.search(chain) or HANDLER.search(chain):
            continue
        group = next((name for name, pattern in GROUPS if any(re.search(pattern, f) for f in frames)), None)
        if group is None:
            if ALLOCATOR.search(frames[0]):
                group = "the allocator (the rest)"
            elif "memmove" in frames[0]:
                group = "copies (the rest)"
            else:
                group = "the run loop, the pipeline, the span, the detached work (the rest)"
        groups[group] = groups.get(group, 0) + 1
    return total, groups


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    rate = int(os.environ.get("BENCH_RATE", "20000"))
    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "perf.data")
        for n in range(runs):
            cpu = record(binary, rate, data)
            total, groups = share(data)
            layer = sum(groups.values())
            print(f"\nRun {n + 1}: the memory server at {rate} requests/s, {cpu:.1f} us of CPU per new request under perf")
            print("| the layer's own code | us per new request |")
            print("|---|---|")
            for name, count in sorted(groups.items(), key=lambda item: -item[1]):
                print(f"| {name} | {cpu * count / total:.2f} |")
            print(f"| **all of it** ({100 * layer / total:.1f}% of the server's samples) | **{cpu * layer / total:.2f}** |")


if __name__ == "__main__":
    main()
