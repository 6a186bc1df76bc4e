"""A recording proxy in front of DynamoDB Local (stdlib only).

Every request a driver sends is forwarded unchanged, bytes and headers,
and its answer comes back unchanged; the proxy records, per call, the
operation (X-Amz-Target), the request and response JSON, the status, the
time the request arrived, and, for writes, each touched item as it was
before and after the call (read by the proxy itself, straight from
DynamoDB Local, with a strongly consistent GetItem that is not recorded).
comparison/dynamodb_cost.py turns the records into capacity units.

The one thing it adds: `ReturnConsumedCapacity: TOTAL` on data-plane calls
that do not ask for it, so that DynamoDB Local's own figure is recorded
beside the computed one (SDKs parse the extra field and ignore it; DynamoDB
Local checks no signature). `inject_capacity=False` turns that off.

    proxy = RecordingProxy(upstream_url); proxy.start(); ...; proxy.calls
"""
import http.client
import http.server
import json
import threading
import time
import urllib.parse

AUTH = ("AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request, "
        "SignedHeaders=host, Signature=0")
DATA_PLANE = {"PutItem", "UpdateItem", "DeleteItem", "GetItem", "Query", "Scan",
              "TransactWriteItems", "TransactGetItems", "BatchGetItem", "BatchWriteItem"}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class RecordingProxy:
    def __init__(self, upstream, inject_capacity=True):
        url = urllib.parse.urlparse(upstream)
        self.host, self.port = url.hostname, url.port
        self.inject_capacity = inject_capacity
        self.calls = []
        self.lock = threading.Lock()
        self.key_schemas = {}
        self.local = threading.local()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def do_POST(self):
                proxy.handle(self)

            def do_GET(self):
                # /__mark/<label>: a driver marks where a measured request
                # starts or ends, in the same order as the calls.
                label = self.path.rsplit("/", 1)[-1]
                with proxy.lock:
                    proxy.calls.append({"t_ns": time.time_ns(), "mark": label})
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def take(self):
        """The calls recorded so far, and a fresh record."""
        with self.lock:
            calls, self.calls = self.calls, []
        return calls

    # -- upstream -------------------------------------------------------
    def connection(self):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        return conn

    def send(self, body, headers):
        for attempt in (0, 1):
            conn = self.connection()
            try:
                conn.request("POST", "/", body, headers)
                response = conn.getresponse()
                return response.status, response.getheaders(), response.read()
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise

    def own_call(self, operation, payload):
        status, _, body = self.send(json.dumps(payload).encode(), {
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": f"DynamoDB_20120810.{operation}",
            "Authorization": AUTH,
        })
        return status, json.loads(body or b"{}")

    def key_schema(self, table):
        if table not in self.key_schemas:
            _, described = self.own_call("DescribeTable", {"TableName": table})
            self.key_schemas[table] = [k["AttributeName"] for k in described["Table"]["KeySchema"]]
        return self.key_schemas[table]

    def read(self, table, key):
        status, body = self.own_call("GetItem", {"TableName": table, "Key": key, "ConsistentRead": True})
        return body.get("Item") if status == 200 else None

    def targets(self, op, request):
        """(table, key) of each item a write touches, in action order."""
        if op in ("UpdateItem", "DeleteItem"):
            return [(request["TableName"], request["Key"])]
        if op == "PutItem":
            table = request["TableName"]
            return [(table, {k: request["Item"][k] for k in self.key_schema(table)})]
        if op == "TransactWriteItems":
            found = []
            for action in request["TransactItems"]:
                (kind, body), = action.items()
                table = body["TableName"]
                key = body["Item"] if kind == "Put" else body["Key"]
                found.append((table, {k: key[k] for k in self.key_schema(table)}))
            return found
        return []

    # -- one request ----------------------------------------------------
    def handle(self, handler):
        arrived = time.time_ns()
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        target = handler.headers.get("X-Amz-Target", "")
        op = target.rsplit(".", 1)[-1]
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            request = None
        body = raw
        injected = False
        if self.inject_capacity and op in DATA_PLANE and isinstance(request, dict) \
                and "ReturnConsumedCapacity" not in request:
            body = json.dumps(dict(request, ReturnConsumedCapacity="TOTAL")).encode()
            injected = True
        targets = self.targets(op, request) if request else []
        before = [self.read(table, key) for table, key in targets]
        status, response_headers, response_body = self.send(body, headers)
        after = [self.read(table, key) for table, key in targets]
        try:
            response = json.loads(response_body or b"{}")
        except ValueError:
            response = None
        if op in DATA_PLANE:
            with self.lock:
                self.calls.append({"t_ns": arrived, "op": op, "request": request, "status": status,
                                   "response": response, "before": before, "after": after,
                                   "capacity_injected": injected})
        handler.send_response(status)
        for name, value in response_headers:
            if name.lower() not in HOP_BY_HOP:
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(response_body)))
        handler.end_headers()
        handler.wfile.write(response_body)
