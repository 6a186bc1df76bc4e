"""The two envelopes of `opens_envelopes_built_from_the_documented_format`
(src/encryption/envelope.rs), built from the format that module documents by
an implementation other than the crate's: Python's `cryptography` (AES-256-GCM)
and zlib (raw deflate), with fixed nonces. Prints them in hex.

    python3 scripts/envelope_fixture.py
"""

import struct, zlib
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
key = bytes([7]*32)
def env(key_id, plaintext, deflate, context, rid, fp, status, exp, nonce):
    flags = 0
    body = plaintext
    if deflate:
        c = zlib.compressobj(wbits=-15); body = c.compress(plaintext) + c.flush(); flags = 1
    kid = key_id.encode()
    header = b"\xffLIE" + bytes([1, flags, len(kid)]) + kid + struct.pack(">H", 0)
    aad = header
    for part in (context, rid, fp, status):
        p = part.encode(); aad += struct.pack(">Q", len(p)) + p
    aad += struct.pack(">Q", exp)
    return header + nonce + AESGCM(key).encrypt(nonce, body, aad)
a = env("fixture-key", b'{"id":"ch_1","card":"4242"}', False, "table-a", "p#abc", "f00d", "COMPLETED", 1_000, bytes(range(12)))
b = env("fixture-key", b'{"n":"' + b"a"*6000 + b'"}', True, "table-a", "p#abc", "f00d", "COMPLETED", 1_000, bytes(range(12, 24)))
print(a.hex()); print(b.hex())
