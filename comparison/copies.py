"""Memory copies per new request, counted by call site (not timed): the
server benchmark's app bare and behind the layer on the memory store,
driven in process by `inproc` with new keys, each copy (glibc's `memcpy`
and `memmove`, which Rust's moves of large values and its slice copies
call) noted by `comparison/copies/count_copies.c`, preloaded.

Prints the copies per request of each app, what the layer adds, and the
layer's largest call sites, each with its function and, for a build with
line tables (CARGO_PROFILE_RELEASE_DEBUG=line-tables-only), the source lines
inlined at it. Copies of kilobytes are futures moved whole: into a box, or
into the state of the future that awaits them.

    python3 comparison/copies.py path/to/inproc [sites]
"""

import os
import subprocess
import sys
import tempfile

REQUESTS = 2000
HERE = os.path.dirname(os.path.abspath(__file__))


def counted(library, binary, app):
    """{site: (calls, bytes)} over one run of 2 x REQUESTS new keys."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "copies.txt")
        env = {**os.environ, "INPROC_APP": app, "INPROC_KEYS": "distinct",
               "LD_PRELOAD": library, "COUNT_COPIES_OUT": out}
        subprocess.run([binary, "1", str(REQUESTS)], env=env, check=True, capture_output=True)
        sites = {}
        with open(out) as lines:
            for line in lines:
                offset, calls, size, path = line.split(maxsplit=3)
                if os.path.realpath(path.strip()) == os.path.realpath(binary):
                    sites[int(offset, 16)] = (int(calls), int(size))
    return sites


def where(binary, offset):
    """The function at a call site, and the source lines inlined there."""
    found = subprocess.run(["addr2line", "-f", "-C", "-i", "-e", binary, hex(offset - 1)],
                           capture_output=True, text=True).stdout.strip().split("\n")
    function = found[0][:100] if found else "?"
    lines = [os.path.basename(found[i]) for i in range(1, min(len(found), 9), 2)]
    return function, " < ".join(line for line in lines if not line.startswith("?"))


def main():
    binary = os.path.abspath(sys.argv[1])
    shown = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    with tempfile.TemporaryDirectory() as folder:
        library = os.path.join(folder, "count_copies.so")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", library,
                        os.path.join(HERE, "copies", "count_copies.c"), "-ldl"], check=True)
        bare = counted(library, binary, "bare")
        layered = counted(library, binary, "memory")
    requests = 2 * REQUESTS
    total = lambda sites, i: sum(figures[i] for figures in sites.values()) / requests
    print(f"Memory copies per new request ({requests} requests, counted)")
    print("| app | copies | bytes |\n|---|---|---|")
    print(f"| bare | {total(bare, 0):.1f} | {total(bare, 1):,.0f} |")
    print(f"| memory | {total(layered, 0):.1f} | {total(layered, 1):,.0f} |")
    print(f"| the layer's | {total(layered, 0) - total(bare, 0):+.1f} | {total(layered, 1) - total(bare, 1):+,.0f} |")
    print(f"\nThe layer's app's largest call sites (bytes per request)")
    print("| bytes | copies | function | inlined at |\n|---|---|---|---|")
    for offset, (calls, size) in sorted(layered.items(), key=lambda item: -item[1][1])[:shown]:
        function, lines = where(binary, offset)
        print(f"| {size / requests:,.0f} | {calls / requests:.1f} | `{function}` | {lines} |")


if __name__ == "__main__":
    main()
