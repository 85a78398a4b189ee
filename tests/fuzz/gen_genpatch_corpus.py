#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""gen_genpatch_corpus.py DIR - writes the seed corpus of fuzz_genpatch into
DIR: patches (store/genvfs.c's format) of the base database that
fuzz_genpatch.c makes from the same SQL (BASE_SQL below: keep the two the
same), as gen.c writes them (every changed page, page 1 always), and a few
damaged ones. Needs Python's sqlite3 and libxxhash (the checksum, XXH3-64).
"""
import ctypes
import ctypes.util
import os
import shutil
import sqlite3
import struct
import sys
import tempfile

BASE_SQL = (
    "PRAGMA page_size=512;"
    "CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c BLOB);"
    "CREATE INDEX tb ON t(b);"
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40) "
    "INSERT INTO t SELECT i, printf('row-%03d', i), zeroblob(i * 7) FROM n;"
    "CREATE TABLE meta(k TEXT PRIMARY KEY, v) WITHOUT ROWID;"
    "INSERT INTO meta VALUES('format', 1), ('note', printf('%.600c', 'x'));"
)

xxh = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
xxh.XXH3_64bits.restype = ctypes.c_uint64
xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def make_patch(pgnos, pages, ps, n_pages, base_gen=1):
    body = b"".join(struct.pack("<I", p) for p in pgnos) + b"".join(pages)
    head = b"ULPGENP1" + struct.pack("<QIIII", base_gen, ps, n_pages, len(pgnos), 0)
    return head + struct.pack("<Q", xxh.XXH3_64bits(body, len(body))) + body


def diff(base, new, ps):
    """The patch that makes base (bytes) into new (bytes), as gen.c writes it."""
    n_pages = len(new) // ps
    pgnos, pages = [], []
    for i in range(n_pages):
        pg = new[i * ps:(i + 1) * ps]
        if i == 0 or base[i * ps:(i + 1) * ps] != pg:
            if i == 0:  # gen.c's unwal(): journal mode DELETE in the header
                pg = pg[:18] + b"\x01\x01" + pg[20:]
            pgnos.append(i + 1)
            pages.append(pg)
    return make_patch(pgnos, pages, ps, n_pages)


def fix_sum(p):
    return p[:32] + struct.pack("<Q", xxh.XXH3_64bits(p[40:], len(p) - 40)) + p[40:]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        base_path = os.path.join(tmp, "base.db")
        db = sqlite3.connect(base_path)
        db.executescript(BASE_SQL)
        db.close()
        base = open(base_path, "rb").read()
        ps = 512
        seeds = {}
        for name, sql in [
            ("update", "UPDATE t SET b = upper(b) WHERE a % 5 = 0;"),
            ("grow", "INSERT INTO t SELECT a + 100, b || '-grown', zeroblob(a * 11) FROM t WHERE a <= 12;"),
            ("schema", "CREATE TABLE u(x, y); INSERT INTO u VALUES(1, 'one'), (2, x'0203');"
                       "CREATE VIEW v AS SELECT a, b FROM t WHERE a < 4;"),
            ("shrink", "DELETE FROM t WHERE a > 8; VACUUM;"),
        ]:
            new_path = os.path.join(tmp, name + ".db")
            shutil.copy(base_path, new_path)
            db = sqlite3.connect(new_path)
            db.executescript(sql)
            db.close()
            seeds[name] = diff(base, open(new_path, "rb").read(), ps)
        n_base = len(base) // ps
        seeds["empty"] = make_patch([], [], ps, n_base)
        # damaged: cut short; a page changed after the checksum; page numbers
        # out of order and past the database (checksum right); a page size
        # other than the base's
        g = seeds["grow"]
        seeds["bad-truncated"] = g[:-100]
        seeds["bad-sum"] = g[:-7] + bytes([g[-7] ^ 0x40]) + g[-6:]
        u = seeds["update"]
        n = struct.unpack_from("<I", u, 24)[0]
        assert n >= 2
        a, b = u[40:44], u[44:48]
        seeds["bad-order"] = fix_sum(u[:40] + b + a + u[48:])
        seeds["bad-range"] = fix_sum(u[:40 + 4 * (n - 1)] + struct.pack("<I", n_base + 5) + u[40 + 4 * n:])
        seeds["bad-pagesize"] = make_patch([1, 2], [base[:4096], base[4096:8192]], 4096, 2)
        for name, data in seeds.items():
            assert len(data) < 64 << 10, name
            with open(os.path.join(out, name + ".patch"), "wb") as f:
                f.write(data)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
