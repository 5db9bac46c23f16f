"""PgBouncer's configuration comes from DATABASE_URL-style URLs (tickweb/pgbouncer.py)."""

from __future__ import annotations

from pathlib import Path

from tickweb.pgbouncer import write


def test_the_config_is_transaction_mode_towards_the_urls_server(tmp_path: Path) -> None:
    ini = write(
        "postgres://owner:s3cret@db.example:6543/tick",
        other_urls=("postgres://tick_web:w%40b@db.example:6543/tick",),
        port=6432,
        directory=tmp_path,
        pool_size=7,
    )

    lines = ini.read_text().splitlines()
    assert "tick = host=db.example port=6543 dbname=tick" in lines
    assert "pool_mode = transaction" in lines
    assert "default_pool_size = 7" in lines
    assert "listen_port = 6432" in lines
    userlist = (tmp_path / "userlist.txt").read_text().splitlines()
    assert userlist == ['"owner" "s3cret"', '"tick_web" "w@b"']  # each login's password
    assert (tmp_path / "userlist.txt").stat().st_mode & 0o077 == 0
