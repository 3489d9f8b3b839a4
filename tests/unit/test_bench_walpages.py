"""bench.walpages reads a real SQLite WAL: its commits, and the B-tree of each page."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from bench.walpages import commits, owners


def wal_database(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # every frame stays in the WAL
    return conn


def test_each_commit_and_the_tables_its_pages_belong_to(tmp_path: Path) -> None:
    db = tmp_path / "x.sqlite3"
    conn = wal_database(db)
    conn.execute("CREATE TABLE a (k TEXT PRIMARY KEY, v TEXT)")
    conn.execute("CREATE TABLE b (n INTEGER PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO b (v) VALUES ('one row of b')")  # one commit: b's page only
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO a VALUES (?, ?)", [(f"k{i}", "x" * 1000) for i in range(40)])
    conn.execute("COMMIT")
    conn.execute("BEGIN")  # a transaction not committed yet: not counted
    conn.execute("INSERT INTO b (v) VALUES ('pending')")

    wal = Path(f"{db}-wal").read_bytes()
    found = commits(wal)
    copy = tmp_path / "copy.sqlite3"
    shutil.copyfile(db, copy)
    Path(f"{copy}-wal").write_bytes(wal)
    owner = owners(copy)
    conn.rollback()
    conn.close()

    assert len(found) == 4  # two CREATE TABLEs, the row of b, the 40 rows of a
    firsts = [first for _, first, _ in found]
    assert firsts == sorted(firsts) and firsts[0] == 0
    one_row = {owner[p] for p in found[2][2]}
    assert "b" in one_row and "a" not in one_row
    many = [owner[p] for p in found[3][2]]
    # 40 rows of 1 kB do not fit a 4 KiB page: several pages of a, and of its key's index
    assert many.count("a") >= 10
    assert many.count("sqlite_autoindex_a_1") >= 1
    assert "b" not in many


def test_frames_of_an_earlier_generation_are_not_counted(tmp_path: Path) -> None:
    db = tmp_path / "x.sqlite3"
    conn = wal_database(db)
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [("x" * 3000,)] * 20)  # 20 commits
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    conn.execute("INSERT INTO t VALUES ('after the checkpoint')")  # the WAL starts over
    wal = Path(f"{db}-wal").read_bytes()
    conn.close()

    found = commits(wal)
    assert len(found) == 1  # the older frames behind it carry the old salts
    assert commits(b"") == []
