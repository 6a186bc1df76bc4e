#!/usr/bin/env python3
"""Runs the functions under `sam local`, in Docker, against DynamoDB Local.

    sam_local.py          every event in events/ through `sam local invoke`,
                          then `sam local start-api` driven with HTTP (make sam-local)
    sam_local.py tables   only creates the tables, named as sam local passes
                          them to the functions (to run sam local by hand)

Run it under scripts/with-docker and scripts/with-dynamodb-local (make
sam-local does): they provide DOCKER_HOST, DOCKER_BRIDGE_ADDRESS (where the
containers reach this host) and AWS_ENDPOINT_URL_DYNAMODB. It builds the
functions for this machine (x86_64, debug: the build the rest of make test
already made), builds the base image SAM runs provided.al2023 functions on
(nothing can be pulled here), creates the tables from template.yaml, runs
every file in events/ through `sam local invoke` against template.yaml
itself and the function its name says, then serves the API with
`sam local start-api` and drives it with real HTTP requests, checking each
answer and the tables. It stops what it started; scripts/with-docker removes
any container left.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse

from charges_local import (CHARGE, ROOT, TABLES, Checks, Function, burst, count_charges, create_tables, free_port,
                           http_response, ledger, post, receipts)

SAM = os.environ.get("SAM", os.path.join(ROOT, ".tools", "sam", "bin", "sam"))
CARGO = os.environ.get("CARGO", "cargo")
DOCKER = "/usr/bin/docker"
BASE_IMAGE = "public.ecr.aws/lambda/provided:al2023-x86_64"
# SAM adds its Runtime Interface Emulator to the base image under this name
# and reuses it while it exists: it goes whenever the base image changes.
RAPID_IMAGE = "public.ecr.aws/lambda/provided:al2023-rapid-x86_64"
ROOTFS_LABEL = "lambda-idempotency.rootfs"
# sam local passes `!Ref SomeTable` to a function as the logical id.
SAM_TABLES = {logical_id: logical_id for logical_id in TABLES}
FUNCTIONS = {"charges": "ChargesFunction", "receipts": "ReceiptsFunction", "ledger": "LedgerFunction",
             "completer": "CompleterFunction"}
INVOKE_TIMEOUT_S = 180


def function_for(event_file):
    """The function an event in events/ is for, by its name."""
    name = os.path.basename(event_file)
    if name.startswith(("http-", "rest-")):
        return "charges"
    if name.startswith("sqs-"):
        return "receipts"
    if name.startswith("dynamodb-stream-"):
        return "ledger"
    if name.startswith("eventbridge-"):
        return "completer"
    return None


def sam_env():
    env = dict(os.environ)
    env.update({
        "SAM_CLI_TELEMETRY": "0",
        # Every sam command asks STS for the account id first; a closed local
        # port answers at once where retries would take 6 s.
        "AWS_ENDPOINT_URL_STS": "http://127.0.0.1:9",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_DEFAULT_REGION": env.get("AWS_REGION", "us-east-1"),
    })
    # sam local lets the shell override any variable the template declares:
    # this one (127.0.0.1, the host's loopback) would win over the parameter.
    env.pop("AWS_ENDPOINT_URL_DYNAMODB", None)
    return env


# --- the functions and the image they run on -------------------------------

def build_binaries():
    """The functions' executables by name, built for this machine by cargo
    (nothing to compile when make test's earlier steps built them)."""
    names = list(FUNCTIONS)
    output = subprocess.run(
        [CARGO, "build", "--message-format=json-render-diagnostics", *(f"--bin={name}" for name in names)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    paths = {}
    for line in output.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("executable") \
                and message["target"]["name"] in names:
            paths[message["target"]["name"]] = message["executable"]
    missing = set(names) - set(paths)
    if missing:
        raise RuntimeError(f"cargo build made no executable for {sorted(missing)}")
    return paths


def code_dirs(binaries, scratch):
    """One directory a function, holding its executable as `bootstrap`, as
    `sam build` lays it out; sam local mounts it at /var/task."""
    dirs = {}
    for name, path in binaries.items():
        directory = os.path.join(scratch, FUNCTIONS[name])
        os.makedirs(directory)
        try:
            os.link(path, os.path.join(directory, "bootstrap"))
        except OSError:  # another file system
            shutil.copy2(path, os.path.join(directory, "bootstrap"))
        dirs[name] = directory
    return dirs


def shared_libraries(binaries):
    libraries = set()
    for path in binaries.values():
        for line in subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout.splitlines():
            # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
            for word in line.split():
                if word.startswith("/"):
                    libraries.add(word)
    return sorted(libraries)


def static_busybox():
    """Debian's busybox-static: the shell and tools SAM's image build and the
    emulator need (its RUN step, /bin/sh)."""
    busybox = "/bin/busybox"
    dynamic = os.path.exists(busybox) and "=>" in subprocess.run(["ldd", busybox], capture_output=True,
                                                                  text=True).stdout
    if not os.path.exists(busybox) or dynamic:
        print("sam_local: installing Debian's busybox-static package", file=sys.stderr)
        install = ["apt-get", "install", "-y", "-qq", "busybox-static"]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(install, env=env).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(install, env=env, check=True)
    return busybox


def base_image(binaries):
    """Builds, when its content changed, the image SAM expects for
    provided.al2023 on x86_64 (what AWS publishes cannot be pulled here): a
    static busybox for /bin/sh and the shared libraries the functions link,
    all from this machine."""
    busybox = static_busybox()
    # The AWS SDK's HTTPS client will not start without root certificates,
    # even when it only speaks HTTP to DynamoDB Local.
    files = {"bin/busybox": busybox, "etc/ssl/certs/ca-certificates.crt": "/etc/ssl/certs/ca-certificates.crt"}
    # Beside what the functions link here, the glibc libraries that a build
    # for an older glibc (cargo lambda's zig, which `sam build` runs) links,
    # as AWS's image has them.
    older = [f"/lib/x86_64-linux-gnu/{name}" for name in ("libpthread.so.0", "libdl.so.2", "librt.so.1")]
    for library in shared_libraries(binaries) + [path for path in older if os.path.exists(path)]:
        files[library.lstrip("/")] = os.path.realpath(library)
    digest = hashlib.sha256()
    for name, source in sorted(files.items()):
        with open(source, "rb") as f:
            digest.update(name.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    digest = digest.hexdigest()[:16]
    current = subprocess.run([DOCKER, "image", "inspect", "--format", "{{ index .Config.Labels \"%s\" }}"
                              % ROOTFS_LABEL, BASE_IMAGE], capture_output=True, text=True)
    if current.returncode == 0 and current.stdout.strip() == digest:
        return "kept"
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    with tempfile.NamedTemporaryFile(suffix=".tar") as archive:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            def directory(name, mode=0o755):
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
            for name in ("bin", "etc", "etc/ssl", "etc/ssl/certs", "tmp", "var", "var/task", "var/runtime", "opt"):
                directory(name, 0o1777 if name == "tmp" else 0o755)
            for name, source in sorted(files.items()):
                tar.add(source, arcname=name)
            for applet in applets:
                if applet != "busybox":
                    info = tarfile.TarInfo(f"bin/{applet}")
                    info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                    tar.addfile(info)
        archive.flush()
        subprocess.run([DOCKER, "rmi", "--force", RAPID_IMAGE], capture_output=True)
        subprocess.run([DOCKER, "import", "--change", f"LABEL {ROOTFS_LABEL}={digest}",
                        "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin", "--change", "WORKDIR /var/task",
                        archive.name, BASE_IMAGE], check=True, stdout=subprocess.DEVNULL)
    return "built"


# --- sam local -------------------------------------------------------------

def parameter_overrides(endpoint):
    return ["--parameter-overrides", f"Architecture=x86_64 LocalDynamoDbEndpoint={endpoint}"]


class Invoker:
    """`sam local invoke` with the interface of charges_local.Function.invoke,
    so the same checks run under both."""

    def __init__(self, dirs, endpoint):
        self.dirs = dirs
        self.endpoint = endpoint
        self.ran = {}
        self.seconds = []

    def invoke(self, event_file, function="charges"):
        self.ran[os.path.basename(event_file)] = function
        command = [SAM, "local", "invoke", FUNCTIONS[function], "--template", "template.yaml",
                   "--event", event_file, "--skip-pull-image",
                   # CodeUri is ".": this directory, holding `bootstrap`.
                   "--docker-volume-basedir", self.dirs[function], *parameter_overrides(self.endpoint)]
        start = time.monotonic()
        output = subprocess.run(command, cwd=ROOT, env=sam_env(), capture_output=True, text=True,
                                timeout=INVOKE_TIMEOUT_S)
        self.seconds.append(time.monotonic() - start)
        lines = [line for line in output.stdout.splitlines() if line.strip()]
        try:
            response = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise RuntimeError(f"sam local invoke {event_file}: exit {output.returncode}, no JSON answer\n"
                               f"{output.stdout[-2000:]}\n{output.stderr[-4000:]}") from None
        if isinstance(response, dict) and "errorType" in response:
            raise RuntimeError(f"sam local invoke {event_file}: {response}\n{output.stderr[-4000:]}")
        return http_response(response) if function == "charges" else response


class Api(Function):
    """charges behind `sam local start-api` (an HTTP API: payload format 2.0),
    a new container a request, as Lambda runs concurrent requests in
    separate execution environments. (`--warm-containers` would serialise
    them, and it fails here: SAM hashes the whole CodeUri, the repository.)"""

    def __init__(self, code_dir, endpoint):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="sam-local-start-api.", suffix=".log", delete=False)
        command = [SAM, "local", "start-api", "--template", "template.yaml", "--skip-pull-image",
                   "--host", "127.0.0.1", "--port", str(self.port), "--docker-volume-basedir", code_dir,
                   *parameter_overrides(endpoint)]
        self.process = subprocess.Popen(command, cwd=ROOT, env=sam_env(), stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def base(self):
        return ""

    def request(self, method, path, body=None, headers=None, timeout=120):
        return super().request(method, path, body, headers, timeout)


def remove_containers():
    """The Lambda containers SAM left (a stopped start-api can leave some)."""
    ids = subprocess.run([DOCKER, "ps", "-aq", "--filter", "label=sam.cli.container.type"],
                         capture_output=True, text=True).stdout.split()
    if ids:
        subprocess.run([DOCKER, "rm", "--force", *ids], capture_output=True)
    return len(ids)


# --- the checks ------------------------------------------------------------

# The template as SAM resolves it, with and without the local overrides (run
# by the SAM CLI's own Python).
RESOLVE_TEMPLATE = r"""
import json, sys
from samcli.lib.providers.sam_base_provider import SamBaseProvider
from samcli.yamlhelper import yaml_parse
with open("template.yaml") as f:
    template = yaml_parse(f.read())
functions = {}
for name, overrides in (("default", {}), ("local", json.loads(sys.argv[1]))):
    resources = SamBaseProvider.get_template(template, overrides)["Resources"]
    functions[name] = {logical_id: {"variables": (resource["Properties"].get("Environment") or {}).get("Variables"),
                                    "architectures": resource["Properties"].get("Architectures")}
                       for logical_id, resource in resources.items()
                       if resource["Type"] == "AWS::Serverless::Function"}
print(json.dumps(functions))
"""


def template_parameters(c, endpoint):
    """What differs locally is the parameters' doing; the template's defaults
    are what AWS gets."""
    python = os.path.join(os.path.dirname(SAM), "python")
    overrides = {"Architecture": "x86_64", "LocalDynamoDbEndpoint": endpoint}
    output = subprocess.run([python, "-c", RESOLVE_TEMPLATE, json.dumps(overrides)], cwd=ROOT,
                            capture_output=True, text=True, check=True)
    functions = json.loads(output.stdout)
    default, local = functions["default"], functions["local"]
    c.check("template: every function", sorted(default) == sorted(FUNCTIONS.values()), sorted(default))
    c.check("template: by default every function is arm64 and has no AWS_ENDPOINT_URL_DYNAMODB at all",
            all(f["architectures"] == ["arm64"] and isinstance(f["variables"], dict)
                and "AWS_ENDPOINT_URL_DYNAMODB" not in f["variables"] for f in default.values()), default)
    c.check("template: with the overrides, x86_64 and AWS_ENDPOINT_URL_DYNAMODB set to the endpoint",
            all(f["architectures"] == ["x86_64"] and isinstance(f["variables"], dict)
                and f["variables"].get("AWS_ENDPOINT_URL_DYNAMODB") == endpoint for f in local.values()), local)
    c.check("template: otherwise the same variables",
            all({k: v for k, v in local[name]["variables"].items() if k != "AWS_ENDPOINT_URL_DYNAMODB"}
                == default[name]["variables"] for name in default), functions)

def field(body, name):
    return body.get(name, "") if isinstance(body, dict) else ""


def api_events(c, fn, api):
    """One API's events for charges, in the order a client would send them."""
    table = SAM_TABLES["ChargesTable"]
    before = count_charges(table)
    status, headers, first = fn.invoke(f"events/{api}-create-charge.json")
    c.check(f"{api}: a charge is created: 201 with a ch_ id",
            status == 201 and field(first, "id").startswith("ch_"), (status, first))
    c.check(f"{api}: its Location names it", headers.get("location") == f"/v1/charges/{field(first, 'id')}", headers)
    status, headers, again = fn.invoke(f"events/{api}-create-charge-replay.json")
    c.check(f"{api}: the replay gets the same charge, Idempotent-Replayed: true",
            status == 201 and again == first and headers.get("idempotent-replayed") == "true", (status, again))
    status, _, other = fn.invoke(f"events/{api}-create-charge-tenant-b.json")
    c.check(f"{api}: tenant B with the same key gets a charge of its own",
            status == 201 and field(other, "id").startswith("ch_") and field(other, "id") != field(first, "id"),
            (status, other))
    status, _, body = fn.invoke(f"events/{api}-create-charge-different-body.json")
    c.check(f"{api}: same key, different body: 422 idempotency-key-reused",
            status == 422 and field(body, "type").endswith("idempotency-key-reused"), (status, body))
    status, headers, body = fn.invoke(f"events/{api}-create-charge-missing-key.json")
    c.check(f"{api}: missing key: 400 problem+json",
            status == 400 and headers.get("content-type") == "application/problem+json", (status, body))
    status, _, body = fn.invoke(f"events/{api}-create-charge-invalid-key.json")
    c.check(f"{api}: invalid key: 400 idempotency-key-invalid",
            status == 400 and field(body, "type").endswith("idempotency-key-invalid"), (status, body))
    if os.path.exists(os.path.join(ROOT, f"events/{api}-create-charge-invalid-body.json")):
        status, _, body = fn.invoke(f"events/{api}-create-charge-invalid-body.json")
        c.check(f"{api}: invalid body: 400 invalid-charge",
                status == 400 and field(body, "type").endswith("invalid-charge"), (status, body))
    status, _, body = fn.invoke(f"events/{api}-get-charge.json")
    c.check(f"{api}: GET of an unknown charge: 404", status == 404, (status, body))
    c.check(f"{api}: two charges written (tenant A's and B's)", count_charges(table) == before + 2,
            count_charges(table) - before)


def completer(c, fn):
    """The scheduled completer's event: a run that reports (the template's
    default policy) and writes nothing."""
    out = fn.invoke("events/eventbridge-completer-schedule.json", "completer")
    c.check("completer: a scheduled run reports the abandoned claims it finds",
            isinstance(out, dict) and out.get("policy") == "report" and "found" in out, out)


def invoke_every_event(c, fn):
    api_events(c, fn, "http-api")
    api_events(c, fn, "rest-api")
    receipts(c, fn, SAM_TABLES)
    ledger(c, fn, SAM_TABLES)
    completer(c, fn)
    for name in sorted(os.listdir(os.path.join(ROOT, "events"))):
        if name.endswith(".json"):
            c.check(f"events/{name} ran against {function_for(name)}",
                    function_for(name) is not None and fn.ran.get(name) == function_for(name), fn.ran.get(name))


def drive_api(c, fn):
    table = SAM_TABLES["ChargesTable"]
    before = count_charges(table)
    status, headers, first = post(fn, "sam-local-1")
    c.check("start-api: a charge is created: 201", status == 201 and field(first, "id").startswith("ch_"),
            (status, first))
    status, headers, again = post(fn, "sam-local-1", {"customer": "cus_42", "currency": "EUR", "amount": 1250})
    c.check("start-api: its retry (keys reordered) replays it, Idempotent-Replayed: true",
            status == 201 and again == first and headers.get("idempotent-replayed") == "true", (status, again))
    status, _, fetched = fn.request("GET", f"/v1/charges/{field(first, 'id')}")
    c.check("start-api: GET returns the charge", status == 200 and fetched == first, (status, fetched))

    start = time.monotonic()
    results = burst(fn, "sam-local-burst", 20)
    seconds = time.monotonic() - start
    statuses = sorted({s for s, _, _ in results})
    # Twenty containers starting at once on 2 cores can run a request past
    # the function's 10 s timeout: the emulator answers 502, as API Gateway
    # would. The client's retry must then get the one charge.
    timed_out = sum(1 for s, _, _ in results if s == 502)
    retries = [post(fn, "sam-local-burst") for _ in range(timed_out)]
    ids = {field(body, "id") for s, _, body in results + retries if s == 201}
    c.check("start-api: 20 concurrent duplicates answer 201 (or 502 when the emulator timed one out)",
            set(statuses) <= {201, 502} and 201 in statuses,
            statuses if set(statuses) <= {201, 502} else f"{statuses}\n{fn.logs()[-3000:]}")
    c.check("start-api: each 502 retried gets the charge replayed",
            all(s == 201 and h.get("idempotent-replayed") == "true" for s, h, _ in retries), retries)
    c.check("start-api: they all see one charge", len(ids) == 1, ids)
    replayed = sum(1 for _, h, _ in results if h.get("idempotent-replayed") == "true")
    print(f"        (burst: 20 requests in {seconds:.1f} s, {replayed} replays, {timed_out} timed out and retried)")

    status, _, body = post(fn, "sam-local-1", dict(CHARGE, amount=9900))
    c.check("start-api: same key, different body: 422",
            status == 422 and field(body, "type").endswith("idempotency-key-reused"), (status, body))
    status, headers, body = post(fn, None)
    c.check("start-api: missing key: 400 problem+json",
            status == 400 and headers.get("content-type") == "application/problem+json", (status, body))
    c.check("start-api: exactly two charges written (the first and the burst's)",
            count_charges(table) == before + 2, count_charges(table) - before)


def main():
    # start-api runs in a session of its own: a SIGTERM (make interrupted,
    # scripts/with-docker stopping) must still reach the `finally` that stops it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if sys.argv[1:] == ["tables"]:
        if "AWS_ENDPOINT_URL_DYNAMODB" not in os.environ:
            print("AWS_ENDPOINT_URL_DYNAMODB is not set: run this through scripts/with-dynamodb-local")
            return 2
        create_tables(SAM_TABLES)
        print(f"Created {', '.join(SAM_TABLES)} at {os.environ['AWS_ENDPOINT_URL_DYNAMODB']}")
        return 0
    if sys.argv[1:]:
        print(__doc__)
        return 2
    for variable in ("DOCKER_HOST", "DOCKER_BRIDGE_ADDRESS", "AWS_ENDPOINT_URL_DYNAMODB"):
        if variable not in os.environ:
            print(f"{variable} is not set: run this through scripts/with-docker scripts/with-dynamodb-local "
                  "(make sam-local)")
            return 2
    # The containers reach DynamoDB Local (which listens on every interface)
    # at this host's address on the bridge.
    port = urllib.parse.urlparse(os.environ["AWS_ENDPOINT_URL_DYNAMODB"]).port
    endpoint = f"http://{os.environ['DOCKER_BRIDGE_ADDRESS']}:{port}"
    c = Checks()
    started = time.monotonic()
    binaries = build_binaries()
    print(f"Base image {BASE_IMAGE}: {base_image(binaries)}")
    template_parameters(c, endpoint)
    create_tables(SAM_TABLES)
    scratch = tempfile.mkdtemp(prefix="sam-local.", dir=os.path.join(ROOT, ".tools"))
    api = None
    try:
        dirs = code_dirs(binaries, scratch)
        print(f"Every event in events/ through sam local invoke (functions reach DynamoDB Local at {endpoint})...")
        invoker = Invoker(dirs, endpoint)
        try:
            invoke_every_event(c, invoker)
        except Exception as error:  # report, then go on to the API
            c.check("sam local invoke ran", False, error)
        if invoker.seconds:
            print(f"        ({len(invoker.seconds)} invokes: first {invoker.seconds[0]:.1f} s, "
                  f"then median {sorted(invoker.seconds)[len(invoker.seconds) // 2]:.1f} s)")

        api = Api(dirs["charges"], endpoint)
        print(f"sam local start-api on 127.0.0.1:{api.port}...")
        try:
            api.wait_until_ready(timeout=180)
            drive_api(c, api)
        except Exception as error:  # report with SAM's log
            c.check("sam local start-api ran", False, f"{error}\n{api.logs()}")
    finally:
        if api:
            api.stop()
        left = remove_containers()
        if left:
            print(f"        (removed {left} container(s) sam local left)")
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"        (sam local: {time.monotonic() - started:.0f} s)")
    print(f"\n{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
