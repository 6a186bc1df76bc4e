"""Instructions per request, counted (callgrind), not timed: the server
benchmark's app bare and behind the layer on the memory store, driven in
process by `inproc`, for each build given.

Timed in process, the layer's cost moves by a microsecond from run to run
(tenths of a microsecond apart cannot be told); counted, it moves by a few
instructions, so two builds can be compared change by change. Each figure
is the difference between a run of 2 x N2 and one of 2 x N1 new keys,
divided by the requests between them: start-up and the first batches'
growth drop out.

AWS-LC seeds its random generator once per thread from CPU jitter
(encryption's nonces): hundreds of millions of instructions whose number
depends on timing, so it differs from run to run by more than what is
measured. The count leaves out the seeding (`get_entropy_source`,
inclusive): what is left repeats within about ten instructions from run
to run of one invocation; on a loaded machine, encryption's figures moved
by up to 150 from one invocation to another (paths that depend on time),
so builds are compared within one invocation.

Valgrind's CPU has no SHA extensions, so SHA-256 runs in software there
(about 60,000 instructions for a 1 KB request, where the hardware's take
about 0.7 us): the table gives the layer's count with and without it.

    python3 comparison/instructions.py before=path/to/inproc now=path/to/inproc
"""

import os
import re
import subprocess
import sys
import tempfile

FEWER, MORE = 500, 1500


def counted(binary, app, requests, keys="distinct"):
    """Instructions of the whole run, those of SHA-256's compression, and
    those inside AWS-LC's AEAD calls (sealing with its random nonce,
    opening)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "1", str(requests)],
            env={**os.environ, "INPROC_APP": app, "INPROC_KEYS": keys},
            capture_output=True,
            text=True,
            check=True,
        )
        total = int(re.search(r"Collected : (\d+)", run.stderr).group(1))
        annotated = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", out], capture_output=True, text=True, check=True
        ).stdout
        inclusive = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", out], capture_output=True, text=True, check=True
        ).stdout
    seeding = aead = 0
    for line in inclusive.splitlines():
        figure = re.match(r"\s*([\d,]+)", line)
        if not figure:
            continue
        if "get_entropy_source" in line and not seeding:
            seeding = int(figure.group(1).replace(",", ""))
        # The exported entry points only, each counted once.
        if re.search(r"_EVP_AEAD_CTX_(seal_scatter|open_gather) \[", line):
            aead += int(figure.group(1).replace(",", ""))
    total -= seeding
    # The seeding happens inside the first seal's nonce.
    aead = max(aead - seeding, 0)
    sha = 0
    for line in annotated.splitlines():
        if "sha2::sha256::compress256" in line:
            figure = re.match(r"\s*([\d,]+)", line)
            if figure:
                sha += int(figure.group(1).replace(",", ""))
    return total, sha, aead


def per_request(binary, app, keys="distinct"):
    """Instructions per request, SHA-256's share of them, and AWS-LC's
    AEAD's."""
    fewer = counted(binary, app, FEWER, keys)
    more = counted(binary, app, MORE, keys)
    # `inproc 1 N` runs two batches of N: one not counted, one counted.
    requests = 2 * (MORE - FEWER)
    return tuple((m - f) / requests for m, f in zip(more, fewer))


def main():
    builds = [argument.split("=", 1) for argument in sys.argv[1:]]
    if not builds:
        sys.exit(__doc__)
    print("\nInstructions per request with a new key, 1 KB JSON body (callgrind, counted)")
    print("| build | bare | memory | layer (memory - bare) | layer without SHA-256 "
          "| encryption (memory-encrypted - memory), new / replay | of which in AWS-LC's AEAD (nonce included) |")
    print("|---|---|---|---|---|---|---|")
    for label, binary in builds:
        bare, bare_sha, _ = per_request(binary, "bare")
        memory, memory_sha, _ = per_request(binary, "memory")
        encrypted, _, sealing = per_request(binary, "memory-encrypted")
        replay, _, _ = per_request(binary, "memory", "replays")
        replay_encrypted, _, opening = per_request(binary, "memory-encrypted", "replays")
        layer = memory - bare
        print(f"| {label} | {bare:,.0f} | {memory:,.0f} | {layer:,.0f} | {layer - (memory_sha - bare_sha):,.0f} "
              f"| {encrypted - memory:,.0f} / {replay_encrypted - replay:,.0f} | {sealing:,.0f} / {opening:,.0f} |")


if __name__ == "__main__":
    main()
