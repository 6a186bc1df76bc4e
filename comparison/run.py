#!/usr/bin/env python3
"""The side-by-side benchmark (make bench): one DynamoDB Local, one workload,
five implementations, one after the other.

Run through scripts/with-dynamodb-local. Each driver gets a fresh table and
prints its figures as JSON; this script adds peak memory (/usr/bin/time),
prints the table and the ratios, and writes comparison/results.json.
"""
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from charges_local import dynamodb  # noqa: E402

# A smaller workload for a quick look: BENCH_N=200 BENCH_CONCURRENT=400 make bench.
WORKLOAD = {name: os.environ.get(name, default)
            for name, default in (("BENCH_N", "1000"), ("BENCH_CONCURRENT", "2000"), ("BENCH_CLIENTS", "16"))}
RUST = os.path.join(ROOT, "target", "release", "examples", "bench_driver")
PYTHON = os.path.join(ROOT, ".tools", "bench-py", "bin", "python")
DRIVERS = [
    ("floor", [RUST, "floor"]),
    ("floor-tx", [RUST, "floor-tx"]),
    ("single", [RUST, "single"]),
    ("bare", [RUST, "bare"]),
    ("crate", [RUST, "crate"]),
    ("crate-encrypted", [RUST, "crate-encrypted"]),
    ("cached", [RUST, "cached"]),
    ("postgres", [RUST, "postgres"]),
    ("floor-redis", [RUST, "floor-redis"]),
    ("redis", [RUST, "redis"]),
    # The same two on tokio's single-threaded runtime (BENCH_RUNTIME).
    ("floor-redis-1t", [RUST, "floor-redis"]),
    ("redis-1t", [RUST, "redis"]),
    ("python", [PYTHON, os.path.join(ROOT, "comparison", "powertools_py.py")]),
    ("python-redis", [PYTHON, os.path.join(ROOT, "comparison", "powertools_py.py")]),
    ("typescript", ["node", os.path.join(ROOT, "comparison", "powertools_ts.mjs")]),
]


def create_table(name):
    dynamodb("CreateTable", {
        "TableName": name,
        "AttributeDefinitions": [{"AttributeName": "id", "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}],
        "BillingMode": "PAY_PER_REQUEST",
    })
    dynamodb("UpdateTimeToLive", {"TableName": name,
                                  "TimeToLiveSpecification": {"AttributeName": "expiration", "Enabled": True}})


def run(label, command, run_id):
    table = f"bench-{label}-{run_id}"
    create_table(table)
    env = dict(os.environ, **WORKLOAD, BENCH_TABLE=table, BENCH_ENDPOINT=os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
    # The PostgreSQL and Redis drivers get the servers of scripts/with-postgres
    # and scripts/with-redis; the Python driver uses Redis only when told.
    if label == "postgres":
        env["BENCH_POSTGRES_URL"] = os.environ["IDEMPOTENCY_TEST_POSTGRES_URL"]
    if label in ("redis", "floor-redis", "redis-1t", "floor-redis-1t", "python-redis"):
        env["BENCH_REDIS_URL"] = os.environ["IDEMPOTENCY_TEST_REDIS_URL"]
    if label.endswith("-1t"):
        env["BENCH_RUNTIME"] = "current_thread"
    env["BENCH_T0"] = str(time.time_ns())
    done = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M"] + command, env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{done.stdout}\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rss = [line for line in done.stderr.splitlines() if line.startswith("maxrss_kb=")]
    result["peak_memory_mb"] = int(rss[-1].split("=")[1]) / 1024 if rss else None
    return result


def cell(result, phase, field, digits=2):
    value = result["results"].get(phase, {}).get(field)
    return "n/a" if value is None else f"{value:.{digits}f}"


def pair():
    """The single write against a raw TransactWriteItems of the same items,
    interleaved call by call in one process (make bench-single-write)."""
    run("floor-tx", [RUST, "floor-tx"], "warmup")
    table = "bench-pair"
    create_table(table)
    env = dict(os.environ, BENCH_N=os.environ.get("BENCH_N", "2000"), BENCH_TABLE=table,
               BENCH_ENDPOINT=os.environ["AWS_ENDPOINT_URL_DYNAMODB"], BENCH_T0=str(time.time_ns()))
    done = subprocess.run([RUST, "pair"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"pair failed:\n{done.stdout}\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ours, theirs = result["single_write"], result["raw_transaction"]
    print("| new key, one transaction | median / p99 (ms) | DynamoDB calls |")
    print("|---|---|---|")
    print(f"| raw TransactWriteItems (floor) | {theirs['median_ms']:.2f} / {theirs['p99_ms']:.2f} | {theirs['calls_per_request']:.2f} |")
    print(f"| lambda-idempotency single write | {ours['median_ms']:.2f} / {ours['p99_ms']:.2f} | {ours['calls_per_request']:.2f} |")
    print(f"\nsingle write / raw TransactWriteItems median = {result['ratio']:.3f}")


# The Redis comparison: the Redis store (on both tokio runtimes), its floor,
# and Powertools Python's RedisCachePersistenceLayer.
REDIS_ROUNDS = ["floor-redis", "floor-redis-1t", "redis", "redis-1t", "python-redis"]


def redis_rounds():
    """The Redis store against Powertools on the same redis-server, in
    BENCH_ROUNDS interleaved rounds (the order rotates each round), with the
    server and every driver pinned to one CPU (make bench-redis).

    Why pinned: on a VM a wake-up across vCPUs costs tens of microseconds,
    about a bare round trip's worth, and where the scheduler happens to put
    the client and the server changes from process to process; unpinned,
    even two bare scripts had medians from 0.08 to 0.25 ms from one run to
    the next. One CPU for all measures what each client adds to the same
    round trips. The unpinned figures are in the main table.
    BENCH_PLACEMENT=split puts the server on another CPU than the drivers:
    every round trip then pays two wake-ups across vCPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    cpu = str(cpus[-1])
    split = os.environ.get("BENCH_PLACEMENT") == "split" and len(cpus) > 1
    server_cpu = str(cpus[0]) if split else cpu
    server = os.environ["IDEMPOTENCY_TEST_REDIS_PID"]
    rounds = int(os.environ.get("BENCH_ROUNDS", "5"))
    subprocess.run(["taskset", "-a", "-p", "-c", server_cpu, server], check=True, capture_output=True)
    commands = dict(DRIVERS)
    # A discarded round first: the servers the harness just started (the
    # JVM of DynamoDB Local, where each run creates its table) are still
    # warming up, and slowed the first round's drivers.
    print("warm-up round (discarded)...", flush=True)
    for label in REDIS_ROUNDS:
        run(label, ["taskset", "-c", cpu] + commands[label], "warmup")
    runs = {label: [] for label in REDIS_ROUNDS}
    for r in range(rounds):
        order = REDIS_ROUNDS[r % len(REDIS_ROUNDS):] + REDIS_ROUNDS[:r % len(REDIS_ROUNDS)]
        print(f"round {r + 1} of {rounds}: {', '.join(order)}...", flush=True)
        for label in order:
            runs[label].append(run(label, ["taskset", "-c", cpu] + commands[label], f"round{r}"))

    def phase_median(label, phase):
        values = [result["results"][phase]["median_ms"] for result in runs[label] if phase in result["results"]]
        return statistics.median(values) if values else None

    where = f"server on CPU {server_cpu}, drivers on CPU {cpu}" if split else f"server and drivers on CPU {cpu}"
    print(f"\nRedis store against Powertools Python (RedisCachePersistenceLayer), {where}, "
          f"{rounds} interleaved rounds; medians of the rounds' medians (ms), and each round's new-key median:")
    print("| implementation | new key | replay | concurrent | store calls new / replay | new key, each round |")
    print("|---|---|---|---|---|---|")
    for label in REDIS_ROUNDS:
        first = runs[label][0]
        cells = [phase_median(label, phase) for phase in ("new", "replay", "concurrent")]
        each = ", ".join(f"{result['results']['new']['median_ms']:.3f}" for result in runs[label])
        print(f"| {first['impl']} | " + " | ".join("n/a" if c is None else f"{c:.3f}" for c in cells)
              + f" | {cell(first, 'new', 'calls_per_request')} / {cell(first, 'replay', 'calls_per_request')} | {each} |")
    print("\nRatios to Powertools Python (Redis), per round (lower is better):")
    summary = {}
    for label, runtime in (("redis", "multi-thread"), ("redis-1t", "current-thread")):
        for phase in ("new", "replay", "concurrent"):
            ratios = [ours["results"][phase]["median_ms"] / theirs["results"][phase]["median_ms"]
                      for ours, theirs in zip(runs[label], runs["python-redis"])]
            summary[f"{label}/{phase}"] = ratios
            print(f"  {phase:10} median, Redis store ({runtime} runtime) / Powertools: "
                  f"median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}, best {min(ratios):.2f}")
    for label, floor, runtime in (("redis", "floor-redis", "multi-thread"), ("redis-1t", "floor-redis-1t", "current-thread")):
        print(f"  new key median, Redis store / its floor (two bare scripts), {runtime} runtime: "
              f"{phase_median(label, 'new') / phase_median(floor, 'new'):.2f}")
    name = "results-redis-split.json" if split else "results-redis.json"
    with open(os.path.join(ROOT, "comparison", name), "w") as f:
        json.dump({"server_cpu": server_cpu, "driver_cpu": cpu, "rounds": runs, "ratios": summary}, f, indent=2)


# The DynamoDB comparison in rounds: the crate, its floor (the raw PutItem
# and UpdateItem it stands on), the crate with responses encrypted at rest,
# and the two Powertools ports.
DYNAMODB_ROUNDS = ["floor", "crate", "crate-encrypted", "python", "typescript"]


def dynamodb_rounds():
    """The crate against its floor and Powertools on DynamoDB Local, in
    BENCH_ROUNDS interleaved rounds (the order rotates each round), after a
    discarded warm-up round (make bench).

    Why rounds: run one after the other, the drivers met DynamoDB Local at
    different points of its JVM's warm-up and garbage collection, which
    moved medians more than the differences measured (one run put the crate
    below its own floor). Each round runs every driver once, back to back,
    so a ratio within a round compares like with like; the spread of the
    per-round ratios says how far to trust them."""
    rounds = int(os.environ.get("BENCH_ROUNDS", "5"))
    commands = dict(DRIVERS)
    print("warm-up round (discarded)...", flush=True)
    for label in DYNAMODB_ROUNDS:
        run(label, commands[label], "warmup")
    runs = {label: [] for label in DYNAMODB_ROUNDS}
    for r in range(rounds):
        shift = r % len(DYNAMODB_ROUNDS)
        order = DYNAMODB_ROUNDS[shift:] + DYNAMODB_ROUNDS[:shift]
        print(f"round {r + 1} of {rounds}: {', '.join(order)}...", flush=True)
        for label in order:
            runs[label].append(run(label, commands[label], f"round{r}"))

    def phase_median(label, phase):
        return statistics.median(result["results"][phase]["median_ms"] for result in runs[label])

    print(f"\nDynamoDB Local, {rounds} interleaved rounds; medians of the rounds' medians (ms), "
          "and each round's new-key median:")
    print("| implementation | new key | replay | concurrent | DynamoDB calls new / replay | new key, each round |")
    print("|---|---|---|---|---|---|")
    for label in DYNAMODB_ROUNDS:
        first = runs[label][0]
        cells = [phase_median(label, phase) if phase in first["results"] else None
                 for phase in ("new", "replay", "concurrent")]
        each = ", ".join(f"{result['results']['new']['median_ms']:.2f}" for result in runs[label])
        print(f"| {first['impl']} | " + " | ".join("n/a" if c is None else f"{c:.2f}" for c in cells)
              + f" | {cell(first, 'new', 'calls_per_request')} / {cell(first, 'replay', 'calls_per_request')} | {each} |")

    def ratios(label, other, phase):
        return [ours["results"][phase]["median_ms"] / theirs["results"][phase]["median_ms"]
                for ours, theirs in zip(runs[label], runs[other])]

    print("\nRatios of each round's medians (lower is better): median, worst, best")
    summary = {}
    for label, other, phases in (("crate", "floor", ("new",)),
                                 ("crate", "python", ("new", "replay", "concurrent")),
                                 ("crate", "typescript", ("new", "replay", "concurrent")),
                                 ("crate-encrypted", "crate", ("new", "replay", "concurrent"))):
        for phase in phases:
            values = ratios(label, other, phase)
            summary[f"{label}/{other}/{phase}"] = values
            print(f"  {phase:10} {label} / {other:10}: median {statistics.median(values):.3f}, "
                  f"worst {max(values):.3f}, best {min(values):.3f}")
    with open(os.path.join(ROOT, "comparison", "results-dynamodb-rounds.json"), "w") as f:
        json.dump({"rounds": runs, "ratios": summary}, f, indent=2)


# The cost benchmark: each scenario, each response size, each implementation.
# BENCH_COST_SIZES=256,1024,4096 prices other response sizes (bytes);
# BENCH_COST_SCENARIOS=new,replay a subset of the scenarios (names below).
COST_SIZES = tuple(int(size) for size in os.environ.get("BENCH_COST_SIZES", "1024,16384").split(","))
COST_SCENARIOS = [
    ("new", "new request (claim + completion)"),
    ("replay", "replay"),
    ("cached", "cached replay (in-process cache)"),
    ("single", "single write, one business item"),
    ("transactional", "claim + transactional completion, one business item"),
    ("in-progress", "in progress (409)"),
    ("mismatch", "payload mismatch (422)"),
]
CRATE_SCENARIOS = {"new", "replay", "cached", "single", "transactional", "in-progress", "mismatch"}
POWERTOOLS_SCENARIOS = {"new", "replay", "cached", "in-progress", "mismatch"}
# (name, command, scenarios, environment)
COST_DRIVERS = [
    ("lambda-idempotency", [RUST, "cost"], CRATE_SCENARIOS, {}),
    # The same with DynamoDbStore::compress_responses_above(512).
    ("lambda-idempotency, compress_responses_above(512)", [RUST, "cost"], CRATE_SCENARIOS,
     {"BENCH_COMPRESS_ABOVE": "512"}),
    # The same with EngineBuilder::read_before_claim.
    ("lambda-idempotency, read_before_claim", [RUST, "cost"], CRATE_SCENARIOS,
     {"BENCH_READ_FIRST": "1"}),
    ("Powertools Python", [PYTHON, os.path.join(ROOT, "comparison", "cost_powertools_py.py")],
     POWERTOOLS_SCENARIOS, {}),
    ("Powertools TypeScript", ["node", os.path.join(ROOT, "comparison", "cost_powertools_ts.mjs")],
     POWERTOOLS_SCENARIOS, {}),
]


def measured_calls(calls):
    """The calls between each start and end mark, request by request."""
    requests, current = [], None
    for call in calls:
        if call.get("mark") == "start":
            current = []
        elif call.get("mark") == "end":
            requests.append(current or [])
            current = None
        elif current is not None:
            current.append(call)
    return requests


def local_figure(call):
    """DynamoDB Local's own ConsumedCapacity for a call, when it gave one."""
    consumed = (call.get("response") or {}).get("ConsumedCapacity")
    if isinstance(consumed, list):
        return sum(c.get("CapacityUnits", 0) for c in consumed) if consumed else None
    return consumed.get("CapacityUnits") if consumed else None


def cost():
    """DynamoDB capacity units and on-demand dollars per million requests,
    per scenario, response size and implementation, from the calls that
    crossed a recording proxy (make bench-cost)."""
    sys.path.insert(0, os.path.join(ROOT, "comparison"))
    import dynamodb_cost
    from dynamodb_proxy import RecordingProxy
    wru = float(os.environ.get("BENCH_PRICE_WRU", dynamodb_cost.PRICE_PER_MILLION_WRU))
    rru = float(os.environ.get("BENCH_PRICE_RRU", dynamodb_cost.PRICE_PER_MILLION_RRU))
    n = int(os.environ.get("BENCH_COST_N", "20"))
    only_scenarios = [s for s in os.environ.get("BENCH_COST_SCENARIOS", "").split(",") if s]
    proxy = RecordingProxy(os.environ["AWS_ENDPOINT_URL_DYNAMODB"]).start()
    results, checked, agreed, disagreements = {}, 0, 0, []
    try:
        # BENCH_COST_IMPLS=python,typescript runs a subset (names as in the table).
        wanted = [w.lower() for w in os.environ.get("BENCH_COST_IMPLS", "").split(",") if w]
        for name, command, scenarios, extra in COST_DRIVERS:
            if wanted and not any(w in name.lower() for w in wanted):
                continue
            for size in COST_SIZES:
                for scenario, _ in COST_SCENARIOS:
                    if scenario not in scenarios or (only_scenarios and scenario not in only_scenarios):
                        continue
                    label = f"cost-{len(results)}"
                    table = f"bench-{label}-{time.time_ns()}"
                    create_table(table)
                    env = dict(os.environ, BENCH_TABLE=table, BENCH_ENDPOINT=proxy.url, BENCH_N=str(n),
                               BENCH_COST_SCENARIO=scenario, BENCH_RESPONSE_BYTES=str(size),
                               BENCH_T0=str(time.time_ns()), **extra)
                    proxy.take()
                    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
                    if done.returncode != 0:
                        raise RuntimeError(f"{name} {scenario} failed:\n{done.stdout}\n{done.stderr}")
                    report = json.loads(done.stdout.strip().splitlines()[-1])
                    requests = measured_calls(proxy.take())
                    if len(requests) != n:
                        raise RuntimeError(f"{name} {scenario}: {len(requests)} measured requests, not {n}")
                    wcu = rcu = calls = 0
                    ops = {}
                    for request in requests:
                        for call in request:
                            w, r = dynamodb_cost.call_units(call)
                            wcu, rcu, calls = wcu + w, rcu + r, calls + 1
                            outcome = "" if call["status"] == 200 else " refused"
                            ops[call["op"] + outcome] = ops.get(call["op"] + outcome, 0) + 1
                            figure = local_figure(call)
                            if figure is not None and call["op"] != "TransactWriteItems":
                                checked += 1
                                if abs(figure - (w or r)) < 1e-9:
                                    agreed += 1
                                else:
                                    disagreements.append((name, scenario, size, call["op"], figure, w or r))
                    results[(name, scenario, size)] = {
                        "calls": calls / n, "wcu": wcu / n, "rcu": rcu / n,
                        "dollars_per_million": dynamodb_cost.dollars_per_million(wcu / n, rcu / n, wru, rru),
                        "outcomes": report["outcomes"],
                        "operations": {op: count / n for op, count in sorted(ops.items())},
                    }
                    print(f"  {name:22} {scenario:14} {size:6} bytes: {calls / n:.2f} calls, "
                          f"{wcu / n:.2f} WCU, {rcu / n:.2f} RCU, outcomes {report['outcomes']}", flush=True)
    finally:
        proxy.stop()

    def cells(name, scenario, size):
        r = results.get((name, scenario, size))
        if r is None:
            return ["n/a"] * 3
        return [f"{r['wcu']:g}", f"{r['rcu']:g}", f"{r['dollars_per_million']:.3f}"]

    print(f"\nDynamoDB cost per request, by DynamoDB's published rules, from the calls on the wire "
          f"({n} requests each; on-demand ${wru} per million write units, ${rru} per million read units, "
          f"{dynamodb_cost.PRICE_SOURCE}, checked {dynamodb_cost.PRICE_DATE}):")

    def size_name(size):
        return f"{size // 1024} KB" if size % 1024 == 0 else f"{size} bytes"

    print("| request | implementation | calls | " + " | ".join(f"{size_name(size)}: WCU | RCU | $ per million"
                                                      for size in COST_SIZES) + " |")
    print("|---|---|---|" + "---|---|---|" * len(COST_SIZES))
    for scenario, title in COST_SCENARIOS:
        for name, _, _, _ in COST_DRIVERS:
            if only_scenarios and scenario not in only_scenarios:
                continue
            first = results.get((name, scenario, COST_SIZES[0]))
            calls = "n/a" if first is None else f"{first['calls']:g}"
            print(f"| {title} | {name} | {calls} | "
                  + " | ".join(" | ".join(cells(name, scenario, size)) for size in COST_SIZES) + " |")
    print(f"\nDynamoDB Local's own ConsumedCapacity, where it reports one (plain calls that succeeded): "
          f"{agreed} of {checked} calls agree with the computed units.")
    for name, scenario, size, op, figure, computed in disagreements[:10]:
        print(f"  differs: {name} {scenario} {size} bytes {op}: DynamoDB Local {figure}, computed {computed}")
    with open(os.path.join(ROOT, "comparison", "results-cost.json"), "w") as f:
        json.dump({f"{name}/{scenario}/{size}": r for (name, scenario, size), r in results.items()}, f, indent=2)


def main():
    if "AWS_ENDPOINT_URL_DYNAMODB" not in os.environ:
        sys.exit("run this through scripts/with-dynamodb-local (make bench)")
    if os.environ.get("BENCH_ONLY") == "cost":
        cost()
        return
    if "IDEMPOTENCY_TEST_POSTGRES_URL" not in os.environ or "IDEMPOTENCY_TEST_REDIS_URL" not in os.environ:
        sys.exit("run this through scripts/with-postgres and scripts/with-redis too (make bench)")
    if os.environ.get("BENCH_ONLY") == "pair":
        pair()
        return
    if os.environ.get("BENCH_ONLY") == "redis-rounds":
        redis_rounds()
        return
    if os.environ.get("BENCH_ONLY") == "dynamodb-rounds":
        dynamodb_rounds()
        return
    # BENCH_ONLY=floor-tx,single runs a subset (the single-write pair).
    only = [name for name in os.environ.get("BENCH_ONLY", "").split(",") if name]
    drivers = [(label, command) for label, command in DRIVERS if not only or label in only]
    print("warming DynamoDB Local up (JIT) with discarded floor runs (single writes and transactions)...", flush=True)
    run("floor", [RUST, "floor"], "warmup")
    run("floor-tx", [RUST, "floor-tx"], "warmup")
    results = {}
    for label, command in drivers:
        print(f"running {label}...", flush=True)
        results[label] = run(label, command, "run")

    print("\n| implementation | new key median / p99 (ms) | replay median / p99 (ms) | concurrent median / p99 (ms) | concurrent throughput (req/s) | DynamoDB calls new / replay / concurrent | cold start (ms) | peak memory (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, _ in drivers:
        r = results[label]
        print(f"| {r['impl']} | {cell(r, 'new', 'median_ms')} / {cell(r, 'new', 'p99_ms')} "
              f"| {cell(r, 'replay', 'median_ms')} / {cell(r, 'replay', 'p99_ms')} "
              f"| {cell(r, 'concurrent', 'median_ms')} / {cell(r, 'concurrent', 'p99_ms')} "
              f"| {cell(r, 'concurrent', 'throughput_rps', 0)} "
              f"| {cell(r, 'new', 'calls_per_request')} / {cell(r, 'replay', 'calls_per_request')} / {cell(r, 'concurrent', 'calls_per_request')} "
              f"| {r['cold_start_ms']:.0f} | {r['peak_memory_mb']:.0f} |")

    stores = [label for label in ("crate", "postgres", "floor-redis", "redis", "floor-redis-1t", "redis-1t",
                                  "python-redis") if label in results]
    if stores:
        print("\nEach store side by side (store calls are round trips: one per claim, one per completion, one per replay):")
        print("| store | new key median / p99 (ms) | replay median / p99 (ms) | concurrent median / p99 (ms) | concurrent throughput (req/s) | store calls new / replay / concurrent |")
        print("|---|---|---|---|---|---|")
        for label in stores:
            r = results[label]
            print(f"| {r['impl']} | {cell(r, 'new', 'median_ms')} / {cell(r, 'new', 'p99_ms')} "
                  f"| {cell(r, 'replay', 'median_ms')} / {cell(r, 'replay', 'p99_ms')} "
                  f"| {cell(r, 'concurrent', 'median_ms')} / {cell(r, 'concurrent', 'p99_ms')} "
                  f"| {cell(r, 'concurrent', 'throughput_rps', 0)} "
                  f"| {cell(r, 'new', 'calls_per_request')} / {cell(r, 'replay', 'calls_per_request')} / {cell(r, 'concurrent', 'calls_per_request')} |")

    print("\nRatios (lower is better for latency):")
    for label, runtime in (("redis", "multi-thread"), ("redis-1t", "current-thread")):
        if label not in results or "python-redis" not in results:
            continue
        ours, theirs = results[label]["results"], results["python-redis"]["results"]
        for phase in ("new", "replay", "concurrent"):
            print(f"  {phase:10} median: Redis store ({runtime} runtime) / Powertools Python Redis = "
                  f"{ours[phase]['median_ms'] / theirs[phase]['median_ms']:.2f}")
    if "single" in results and "floor-tx" in results:
        single = results["single"]["results"]["new"]["median_ms"]
        floor_tx = results["floor-tx"]["results"]["new"]["median_ms"]
        print(f"  new key median: single write / raw TransactWriteItems = {single / floor_tx:.3f}")
    if "crate" not in results:
        with open(os.path.join(ROOT, "comparison", "results.json"), "w") as f:
            json.dump(results, f, indent=2)
        return
    ours = results["crate"]["results"]
    for other in [name for name in ("python", "typescript") if name in results]:
        theirs = results[other]["results"]
        for phase in ("new", "replay", "concurrent"):
            print(f"  {phase:10} median: crate / {other:10} = {ours[phase]['median_ms'] / theirs[phase]['median_ms']:.2f}")
        print(f"  cold start: {other} / crate = {results[other]['cold_start_ms'] / results['crate']['cold_start_ms']:.1f}x")
    if "floor" in results:
        floor = results["floor"]["results"]["new"]["median_ms"]
        print(f"  new key median: crate / floor = {ours['new']['median_ms'] / floor:.3f}")
    with open(os.path.join(ROOT, "comparison", "results.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
