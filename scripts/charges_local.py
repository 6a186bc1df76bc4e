#!/usr/bin/env python3
"""Runs the `charges` function locally, against DynamoDB Local.

    charges_local.py demo              the narrated tour (make demo)
    charges_local.py e2e               the end-to-end test (make test)
    charges_local.py invoke EVENT [FUNCTION]   one event from events/ (make invoke)

Run it under scripts/with-dynamodb-local, which provides
AWS_ENDPOINT_URL_DYNAMODB. It creates the tables from template.yaml (the one
source of truth for their definitions), starts `charges` under
`cargo lambda watch` on a free 127.0.0.1 port, drives it with real HTTP
requests and `cargo lambda invoke`, and stops what it started.
"""

import collections
import concurrent.futures
import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = {"IdempotencyTable": "idempotency", "ChargesTable": "charges", "ReceiptsTable": "receipts",
          "LedgerTable": "ledger"}
CARGO_LAMBDA = os.environ.get("CARGO_LAMBDA", "cargo-lambda")
BUILD_TIMEOUT_S = 900


# --- DynamoDB Local, spoken directly (no SDK needed for setup) -------------

def dynamodb(operation, payload):
    url = urllib.parse.urlparse(os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("POST", "/", json.dumps(payload), {
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": f"DynamoDB_20120810.{operation}",
        # DynamoDB Local reads the access key from the header, not the signature.
        "Authorization": "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request, "
                         "SignedHeaders=host, Signature=0",
    })
    response = conn.getresponse()
    body = json.loads(response.read() or b"{}")
    if response.status != 200:
        raise RuntimeError(f"DynamoDB {operation}: {response.status} {body}")
    return body


class CloudFormationLoader(yaml.SafeLoader):
    """Reads a template, keeping `!Ref`/`!GetAtt`/`!Sub` values as plain data."""


CloudFormationLoader.add_multi_constructor(
    "!", lambda loader, suffix, node: (
        loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode)
        else loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node)))


def create_tables(names=TABLES):
    """Creates the template's tables, named by `names` (logical id to name)."""
    with open(os.path.join(ROOT, "template.yaml")) as f:
        template = yaml.load(f, Loader=CloudFormationLoader)
    for logical_id, table_name in names.items():
        props = template["Resources"][logical_id]["Properties"]
        dynamodb("CreateTable", {
            "TableName": table_name,
            "AttributeDefinitions": props["AttributeDefinitions"],
            "KeySchema": props["KeySchema"],
            "BillingMode": props.get("BillingMode", "PAY_PER_REQUEST"),
        })
        ttl = props.get("TimeToLiveSpecification")
        if ttl:
            dynamodb("UpdateTimeToLive", {"TableName": table_name, "TimeToLiveSpecification": ttl})


def count_charges(table=TABLES["ChargesTable"]):
    return dynamodb("Scan", {"TableName": table, "Select": "COUNT", "ConsistentRead": True})["Count"]


# --- a counting proxy in front of DynamoDB Local ---------------------------

class CountingProxy:
    """Forwards every request to DynamoDB Local and counts them by operation
    (the X-Amz-Target header), so the test can say what a request cost."""

    def __init__(self, upstream):
        url = urllib.parse.urlparse(upstream)
        counts = self.counts = collections.Counter()
        lock = self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target = self.headers.get("X-Amz-Target", "?").split(".")[-1]
                with lock:
                    counts[target] += 1
                conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request("POST", self.path, body, headers)
                response = conn.getresponse()
                payload = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                conn.close()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self):
        """The calls counted since the last take."""
        with self.lock:
            counts = dict(self.counts)
            self.counts.clear()
        return counts

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


# --- the function under cargo lambda watch ---------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONCURRENCY = 4


# The template's MetricsNamespace default.
METRICS_NAMESPACE = "LambdaIdempotency"


def emf_answers(fn):
    """The (port, outcome) of every IdempotencyAnswers EMF line in the
    function's log, in the template's namespace."""
    fn.log.flush()
    answers = collections.Counter()
    decoder = json.JSONDecoder()
    with open(fn.log.name) as f:
        for line in f:
            start = line.find("{")
            if start < 0 or "_aws" not in line:
                continue
            try:
                record, _ = decoder.raw_decode(line, start)
            except ValueError:
                continue
            declared = record.get("_aws", {}).get("CloudWatchMetrics", [{}])[0]
            if declared.get("Namespace") == METRICS_NAMESPACE and "IdempotencyAnswers" in record:
                answers[(record.get("Port"), record.get("Outcome"))] += 1
    return answers


class Function:
    def __init__(self, concurrency=CONCURRENCY, dynamodb_endpoint=None, extra_env=None, features=None,
                 function="charges"):
        self.port = free_port()
        self.name = function
        self.log = tempfile.NamedTemporaryFile("w+", prefix="cargo-lambda-watch.", suffix=".log", delete=False)
        env = {
            "IDEMPOTENCY_TABLE": TABLES["IdempotencyTable"],
            "CHARGES_TABLE": TABLES["ChargesTable"],
            "RECEIPTS_TABLE": TABLES["ReceiptsTable"],
            "LEDGER_TABLE": TABLES["LedgerTable"],
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_endpoint or os.environ["AWS_ENDPOINT_URL_DYNAMODB"],
            "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "local"),
            "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "local"),
            "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
            "AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH": "true",
            "AWS_LAMBDA_LOG_FORMAT": "JSON",
            "RUST_LOG": "info",
            # As the template sets it: the engine's answers as EMF lines.
            "IDEMPOTENCY_METRICS_NAMESPACE": METRICS_NAMESPACE,
        }
        env.update(extra_env or {})
        command = [CARGO_LAMBDA, "lambda", "watch", "--invoke-address", "127.0.0.1",
                   "--invoke-port", str(self.port), "--ignore-changes", "--concurrency", str(concurrency),
                   *(["--features", features] if features else []),
                   "--env-vars", ",".join(f"{k}={v}" for k, v in env.items())]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def base(self):
        return f"/lambda-url/{self.name}"

    def request(self, method, path, body=None, headers=None, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        payload = json.dumps(body) if isinstance(body, (dict, list)) else body
        all_headers = {"content-type": "application/json"}
        all_headers.update(headers or {})
        conn.request(method, self.base() + path, payload, all_headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode("utf-8", "replace")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def wait_until_ready(self, timeout=BUILD_TIMEOUT_S):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.process.args[0]} exited:\n" + self.logs())
            try:
                status, _, _ = self.request("GET", "/v1/charges/ch_warmup", timeout=timeout)
                if status in (200, 404, 405):
                    return
            except (ConnectionError, OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        raise RuntimeError("charges did not start in time:\n" + self.logs())

    def invoke(self, event_file, function="charges"):
        output = subprocess.run(
            [CARGO_LAMBDA, "lambda", "invoke", function, "--invoke-address", "127.0.0.1",
             "--invoke-port", str(self.port), "--data-file", event_file],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        if output.returncode != 0:
            raise RuntimeError(f"cargo lambda invoke {event_file}: {output.stderr}")
        response = json.loads(output.stdout)
        return http_response(response) if function == "charges" else response

    def logs(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-8000:]

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        os.unlink(self.log.name)


def http_response(response):
    """(status, headers, body) of an API Gateway response that an invoke returned."""
    body = response.get("body")
    # REST API (v1) responses carry their headers in multiValueHeaders.
    headers = {k.lower(): v[-1] for k, v in (response.get("multiValueHeaders") or {}).items() if v}
    headers.update({k.lower(): v for k, v in (response.get("headers") or {}).items()})
    return response.get("statusCode"), headers, (json.loads(body) if body else None)


CHARGE = {"amount": 1250, "currency": "EUR", "customer": "cus_42"}


def post(fn, key, body=CHARGE):
    headers = {} if key is None else {"idempotency-key": key}
    return fn.request("POST", "/v1/charges", body, headers)


def burst(fn, key, n):
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda _: post(fn, key), range(n)))


# --- the end-to-end test ---------------------------------------------------

class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, condition, detail=""):
        if condition:
            self.passed += 1
            print(f"  ok    {name}")
        else:
            self.failed += 1
            print(f"  FAIL  {name} {detail}")


def e2e(fn, proxy):
    c = Checks()
    start = count_charges()

    # What a request costs in DynamoDB calls. A new charge commits in one
    # write. A replay costs one call (the refused write returns the record),
    # or none once the warm instance serving it has the record cached:
    # cargo lambda watch runs up to CONCURRENCY instances, so each pays at
    # most once.
    proxy.take()
    status, _, cost = post(fn, "e2e-cost")
    calls = proxy.take()
    c.check("a new charge costs one DynamoDB call (TransactWriteItems)",
            status == 201 and calls == {"TransactWriteItems": 1}, calls)
    costs = []
    for _ in range(12):
        status, headers, again = post(fn, "e2e-cost")
        if status != 201 or again != cost or headers.get("idempotent-replayed") != "true":
            costs.append(None)
        else:
            costs.append(sum(proxy.take().values()))
    c.check("12 sequential replays: each costs one call or none, and each instance pays once",
            None not in costs and max(costs) <= 1 and sum(costs) <= CONCURRENCY, costs)

    status, headers, first = post(fn, "e2e-key-1")
    c.check("a charge is created: 201", status == 201, (status, first))
    charge_id = first.get("id", "") if isinstance(first, dict) else ""
    c.check("it has a ch_ id and echoes the body",
            charge_id.startswith("ch_") and first.get("amount") == 1250 and first.get("currency") == "EUR")
    c.check("its Location names it", headers.get("location") == f"/v1/charges/{charge_id}", headers)

    status, headers, replay = post(fn, "e2e-key-1", {"customer": "cus_42", "currency": "EUR", "amount": 1250})
    c.check("the retry (keys reordered) replays it", status == 201 and replay == first, (status, replay))
    c.check("marked Idempotent-Replayed: true", headers.get("idempotent-replayed") == "true", headers)

    status, _, fetched = fn.request("GET", f"/v1/charges/{charge_id}")
    c.check("GET returns the charge", status == 200 and fetched == first, (status, fetched))
    c.check("two charge items so far", count_charges() == start + 2)

    before = count_charges()
    results = burst(fn, "e2e-burst", 50)
    statuses = sorted({s for s, _, _ in results})
    ids = {body["id"] for s, _, body in results if s == 201}
    c.check("50 concurrent duplicates all answer 201: one commits, the others replay it",
            statuses == [201], statuses)
    c.check("they all see one charge", len(ids) == 1, ids)
    c.check("exactly one charge item written", count_charges() == before + 1, count_charges() - before)
    calls = proxy.take()
    replayed = sum(1 for _, h, _ in results if h.get("idempotent-replayed") == "true")
    print(f"        (burst: {replayed} replays; DynamoDB calls: {calls})")

    status, _, body = post(fn, "e2e-key-1", dict(CHARGE, amount=9900))
    c.check("same key, different body: 422", status == 422, (status, body))
    c.check("as problem+json, type idempotency-key-reused",
            isinstance(body, dict) and body.get("type", "").endswith("idempotency-key-reused"), body)

    # What the template's CloudWatch dashboard reads: the engine's answers,
    # one EMF line each, on the function's stdout.
    answers = emf_answers(fn)
    c.check("the answers are CloudWatch EMF lines: http fresh, replays, key_reused",
            answers[("http", "fresh")] >= 3 and answers[("http", "key_reused")] >= 1
            and answers[("http", "replay")] + answers[("http", "cached_replay")] >= 12, dict(answers))

    status, headers, body = post(fn, None)
    c.check("missing key: 400 problem+json",
            status == 400 and headers.get("content-type") == "application/problem+json", (status, body))
    status, _, body = post(fn, "has spaces")
    c.check("invalid key: 400", status == 400 and body.get("type", "").endswith("idempotency-key-invalid"), body)

    before = count_charges()
    status, _, body = post(fn, "e2e-bad-body", {"amount": -1, "currency": "EURO", "customer": ""})
    c.check("invalid body: 400 from the handler", status == 400 and body.get("type", "").endswith("invalid-charge"), body)
    c.check("and no charge written", count_charges() == before)

    status, _, body = fn.request("GET", "/v1/charges/ch_does_not_exist")
    c.check("unknown charge: 404", status == 404, (status, body))

    before = count_charges()
    status_a, _, a = fn.invoke("events/http-api-create-charge.json")
    status_b, _, b = fn.invoke("events/http-api-create-charge-tenant-b.json")
    c.check("tenant A's event (JWT claims) creates a charge", status_a == 201, (status_a, a))
    c.check("tenant B, same key: its own charge", status_b == 201 and a and b and a["id"] != b["id"], (a, b))
    status, headers, again = fn.invoke("events/http-api-create-charge-replay.json")
    c.check("tenant A's replay event gets A's charge", status == 201 and again == a, (status, again))
    status, _, _ = fn.invoke("events/http-api-create-charge-different-body.json")
    c.check("tenant A's different-body event: 422", status == 422, status)
    status, _, rest = fn.invoke("events/rest-api-create-charge.json")
    c.check("REST API (v1) event creates a charge", status == 201, (status, rest))
    status, _, rest_again = fn.invoke("events/rest-api-create-charge-replay.json")
    c.check("REST API (v1) replay gets it back", status == 201 and rest_again == rest, (status, rest_again))
    c.check("three charge items from the events", count_charges() == before + 3, count_charges() - before)

    receipts(c, fn)
    ledger(c, fn)
    streaming(c)

    for name, variable in (("PostgreSQL", "IDEMPOTENCY_TEST_POSTGRES_URL"), ("Redis", "IDEMPOTENCY_TEST_REDIS_URL"),
                           ("Redis Cluster", "IDEMPOTENCY_TEST_REDIS_CLUSTER_URL")):
        url = os.environ.get(variable)
        c.check(f"{name}: {variable} is set (run under scripts/with-postgres and scripts/with-redis)", bool(url))
        if url:
            other_store(c, name, url)

    print(f"\n{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


def read_export(fn, path, key):
    """POSTs to the exports function and reads its NDJSON rows as they
    come: (status, headers, rows, when the first row arrived in epoch ms,
    seconds to the first row)."""
    conn = http.client.HTTPConnection("127.0.0.1", fn.port, timeout=30)
    started = time.time()
    conn.request("POST", fn.base() + path, "{}", {"content-type": "application/json", "idempotency-key": key})
    response = conn.getresponse()
    headers = {k.lower(): v for k, v in response.getheaders()}
    first_line = response.readline()
    first_ms = time.time() * 1000
    first_byte = time.time() - started
    rest = response.read()
    conn.close()
    rows = []
    for line in (first_line + rest).splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            rows.append(line.decode("utf-8", "replace"))
    return response.status, headers, rows, first_ms, first_byte


def streaming(c):
    """Lambda response streaming (`run_with_streaming_response`,
    functions/exports) through the layer: the first row reaches
    the client before the handler wrote the last, and a retry replays every
    row without a second run."""
    fn = Function(concurrency=1, function="exports")
    try:
        print(f"exports (run_with_streaming_response) under cargo lambda watch on 127.0.0.1:{fn.port}...")
        fn.wait_until_ready()
        _, _, bare, bare_first_ms, bare_first_byte = read_export(fn, "/v1/exports-bare", "e2e-export-bare")
        status, headers, rows, first_ms, first_byte = read_export(fn, "/v1/exports", "e2e-export")
        print(f"   first row after {bare_first_byte * 1000:.0f} ms without the layer, "
              f"{first_byte * 1000:.0f} ms through it (5 rows, 400 ms apart)")
        written = [row.get("written_ms") for row in rows if isinstance(row, dict)]
        c.check("streaming: five rows through the layer", status == 200 and len(written) == 5, (status, rows))
        c.check("streaming: the first row arrived before the handler wrote the last",
                len(written) == 5 and first_ms < written[-1], (first_ms, written))
        bare_written = [row.get("written_ms") for row in bare if isinstance(row, dict)]
        c.check("streaming: without the layer too (the emulator streams)",
                len(bare_written) == 5 and bare_first_ms < bare_written[-1], (bare_first_ms, bare))
        # The record completes just after the body ends.
        for _ in range(20):
            again_status, again_headers, again, _, _ = read_export(fn, "/v1/exports", "e2e-export")
            if again_status != 409:
                break
            time.sleep(0.2)
        c.check("streaming: a retry replays every row, written once",
                again_status == 200 and again == rows and again_headers.get("idempotent-replayed") == "true",
                (again_status, again_headers, again))
    finally:
        fn.stop()


def receipts(c, fn, tables=TABLES):
    """The SQS consumer: a producer's duplicate and a redelivery send no
    receipt twice."""
    first = fn.invoke("events/sqs-receipts-batch-with-duplicates.json", "receipts")
    c.check("receipts: a batch with a producer's duplicate has no failures",
            first.get("batchItemFailures") == [], first)
    again = fn.invoke("events/sqs-receipts-redelivery.json", "receipts")
    c.check("receipts: the redelivery batch has no failures", again.get("batchItemFailures") == [], again)
    items = dynamodb("Scan", {"TableName": tables["ReceiptsTable"], "ConsistentRead": True})["Items"]
    sent = {item["charge_id"]["S"]: int(item["sent"]["N"]) for item in items}
    c.check("receipts: three charges, each receipt sent exactly once",
            len(sent) == 3 and set(sent.values()) == {1}, sent)


def ledger(c, fn, tables=TABLES):
    """The DynamoDB Streams pipeline: every charge is booked once however the
    shard is delivered and retried, and a record that cannot be booked is
    the checkpoint."""
    def entries():
        items = dynamodb("Scan", {"TableName": tables["LedgerTable"], "ConsistentRead": True})["Items"]
        return {item["charge_id"]["S"]: int(item["entries"]["N"]) for item in items}

    def checkpoints(response):
        return [failure.get("itemIdentifier") for failure in response.get("batchItemFailures", [])]

    first = fn.invoke("events/dynamodb-stream-charges-batch.json", "ledger")
    c.check("ledger: a batch of three charges has no failures", checkpoints(first) == [], first)
    again = fn.invoke("events/dynamodb-stream-charges-redelivery.json", "ledger")
    c.check("ledger: a batch with two redelivered records has no failures", checkpoints(again) == [], again)
    c.check("ledger: four charges, each booked once after the redelivery",
            entries() == {f"ch_ledger_{i}": 1 for i in (1, 2, 3, 4)}, entries())

    with open(os.path.join(ROOT, "events/dynamodb-stream-charges-half-failed.json")) as f:
        records = json.load(f)["Records"]
    poison = records[1]["dynamodb"]["SequenceNumber"]
    # The poison record and every record after it: Lambda checkpoints at the
    # lowest sequence number reported.
    from_poison = [record["dynamodb"]["SequenceNumber"] for record in records[1:]]
    half = fn.invoke("events/dynamodb-stream-charges-half-failed.json", "ledger")
    c.check("ledger: a batch that fails halfway names the record without a charge id as the checkpoint",
            checkpoints(half) == from_poison and min(map(int, checkpoints(half))) == int(poison), half)
    booked = entries()
    c.check("ledger: the record before the checkpoint is booked, the one after it waits",
            booked.get("ch_ledger_5") == 1 and "ch_ledger_7" not in booked, booked)
    # Lambda resumes the shard at the checkpoint, then gives up on the poison
    # record (MaximumRetryAttempts) and resumes after it; and a bisected retry
    # brings the whole batch once more.
    with tempfile.TemporaryDirectory() as scratch:
        retries = []
        for name, batch in (("resume", records[1:]), ("after-give-up", records[2:]), ("whole", records)):
            path = os.path.join(scratch, f"{name}.json")
            with open(path, "w") as f:
                json.dump({"Records": batch}, f)
            retries.append(fn.invoke(path, "ledger"))
    resume, after, whole = retries
    c.check("ledger: the retry from the checkpoint stops there again", checkpoints(resume) == from_poison, resume)
    c.check("ledger: after the give-up the shard completes", checkpoints(after) == [], after)
    c.check("ledger: the whole batch again stops at the poison record", checkpoints(whole) == from_poison, whole)
    c.check("ledger: every charge booked exactly once after the retried half-failed batch",
            entries() == {f"ch_ledger_{i}": 1 for i in (1, 2, 3, 4, 5, 7)}, entries())


def other_store(c, name, url):
    """charges and receipts with their idempotency records in another store:
    the business write happens between claim and completion; duplicates
    still make one."""
    fn = Function(extra_env={"IDEMPOTENCY_STORE_URL": url}, features="postgres,redis")
    try:
        print(f"charges on {name} (IDEMPOTENCY_STORE_URL), cargo lambda watch on 127.0.0.1:{fn.port}...")
        fn.wait_until_ready()
        before = count_charges()
        key = f"e2e-{name.lower().replace(' ', '-')}"
        status, _, first = post(fn, key)
        c.check(f"{name}: a charge is created: 201", status == 201, (status, first))
        status, headers, again = post(fn, key)
        c.check(f"{name}: its retry replays it", status == 201 and again == first
                and headers.get("idempotent-replayed") == "true", (status, again))
        results = burst(fn, f"{key}-burst", 50)
        statuses = sorted({s for s, _, _ in results})
        ids = {body["id"] for s, _, body in results if s == 201}
        c.check(f"{name}: 50 concurrent duplicates answer 201 or 409, one charge",
                set(statuses) <= {201, 409} and len(ids) == 1, (statuses, ids))
        status, _, body = post(fn, key, dict(CHARGE, amount=9900))
        c.check(f"{name}: same key, different body: 422", status == 422, (status, body))
        c.check(f"{name}: exactly two charge items written", count_charges() == before + 2,
                count_charges() - before)
        for item in dynamodb("Scan", {"TableName": TABLES["ReceiptsTable"], "ConsistentRead": True})["Items"]:
            dynamodb("DeleteItem", {"TableName": TABLES["ReceiptsTable"], "Key": {"charge_id": item["charge_id"]}})
        first = fn.invoke("events/sqs-receipts-batch-with-duplicates.json", "receipts")
        again = fn.invoke("events/sqs-receipts-redelivery.json", "receipts")
        c.check(f"{name}: receipts batches have no failures",
                first.get("batchItemFailures") == [] and again.get("batchItemFailures") == [], (first, again))
        items = dynamodb("Scan", {"TableName": TABLES["ReceiptsTable"], "ConsistentRead": True})["Items"]
        sent = {item["charge_id"]["S"]: int(item["sent"]["N"]) for item in items}
        c.check(f"{name}: receipts: three charges, each receipt sent exactly once",
                len(sent) == 3 and set(sent.values()) == {1}, sent)
    except Exception as error:  # report with the function's logs
        c.check(f"{name}: charges ran", False, f"{error}\n{fn.logs()}")
    finally:
        fn.stop()


# --- the narrated demo -----------------------------------------------------

def say(text):
    print(f"\n\033[1m{text}\033[0m" if sys.stdout.isatty() else f"\n{text}")


def show(label, result):
    status, headers, body = result
    marker = "  (Idempotent-Replayed: true)" if headers.get("idempotent-replayed") == "true" else ""
    print(f"  {label}: {status}{marker}\n    {json.dumps(body)}")


def demo(fn, proxy):
    say("1. A client creates a charge with an Idempotency-Key.")
    print(f"   POST /v1/charges  Idempotency-Key: demo-order-1001  {json.dumps(CHARGE)}")
    first = post(fn, "demo-order-1001")
    show("response", first)

    say("2. Its connection dropped, so it retries with the same key.")
    show("response", post(fn, "demo-order-1001"))
    print("   Same charge, nothing ran twice: the stored response was replayed.")

    say("3. A flaky client fires 20 identical requests at once.")
    proxy.take()
    results = burst(fn, "demo-order-1002", 20)
    created = {body["id"] for s, _, body in results if s == 201}
    replayed = sum(1 for _, h, _ in results if h.get("idempotent-replayed") == "true")
    print(f"   {sum(1 for s, _, _ in results if s == 201)} x 201, one charge ({', '.join(created)}): "
          f"one commit won, {replayed} got it replayed.")
    print(f"   DynamoDB calls for the 20: {sum(proxy.take().values())} (at most one write per request, no claim "
          "first; a warm instance replays from its cache).")

    say("4. The same key with a different amount is refused.")
    show("response", post(fn, "demo-order-1001", dict(CHARGE, amount=99900)))

    say("5. A request without a key is refused.")
    show("response", post(fn, None))

    say("6. What is in the charges table?")
    print(f"   {count_charges()} charges for 22 create requests: one per idempotency key.")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "e2e", "invoke"):
        print(__doc__)
        return 2
    if "AWS_ENDPOINT_URL_DYNAMODB" not in os.environ:
        print("AWS_ENDPOINT_URL_DYNAMODB is not set: run this through scripts/with-dynamodb-local (make demo, make test)")
        return 2
    create_tables()
    # The function reaches DynamoDB Local through the counting proxy.
    proxy = CountingProxy(os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
    fn = Function(dynamodb_endpoint=proxy.url)
    try:
        print(f"Starting charges under cargo lambda watch on 127.0.0.1:{fn.port} (the first build takes a while)...")
        fn.wait_until_ready()
        if sys.argv[1] == "demo":
            demo(fn, proxy)
            print("\nDone. Everything this demo started is stopped now.")
            return 0
        if sys.argv[1] == "invoke":
            event = sys.argv[2] if len(sys.argv) > 2 else ""
            function = sys.argv[3] if len(sys.argv) > 3 else "charges"
            result = fn.invoke(event, function)
            if function == "charges":
                status, headers, body = result
                result = {"statusCode": status, "headers": headers, "body": body}
            print(json.dumps(result, indent=2))
            return 0
        return e2e(fn, proxy)
    except Exception as error:  # report with the function's logs, then stop everything
        print(f"error: {error}\n--- cargo lambda watch log ---\n{fn.logs()}")
        return 1
    finally:
        fn.stop()
        proxy.stop()


if __name__ == "__main__":
    sys.exit(main())
