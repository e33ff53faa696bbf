"""Generate the sync API from the async source: one source of truth (the httpcore model).

    python scripts/unasync.py          # rewrite every generated _sync/ module
    python scripts/unasync.py --check  # CI: fail if a generated module is stale

Each backend with server I/O writes its code once, under ``_async/``; this
script turns it into ``_sync/`` with the token rewrites of the ``unasync``
package plus the per-backend names below, then formats it with ruff. Never
edit a ``_sync/`` module by hand: change the async source and rerun.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

# This script is named unasync too: drop its own directory from the path, so that
# the import below finds the unasync package, not this file.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import unasync  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# Names replaced on top of unasync's own (async def, await, __aenter__...).
# Backends add their rule here: (async source dir, generated sync dir, extra names).
COMMON = {
    "AsyncLockerBase": "LockerBase",
    "AsyncLeaseBase": "LeaseBase",
    "aclose": "close",
    "async_sleep": "sync_sleep",
}
RULES: list[tuple[str, str, dict[str, str]]] = [
    (
        "backends/redis/multilock_redis/_async",
        "backends/redis/multilock_redis/_sync",
        {
            "AsyncRedisLease": "RedisLease",
            "AsyncRedisLocker": "RedisLocker",
            "async_client": "sync_client",
            "async_cluster_client": "sync_cluster_client",
            "async_learn_slots": "sync_learn_slots",
            "async_forget_slots": "sync_forget_slots",
        },
    ),
    (
        "backends/postgres/multilock_postgres/_async",
        "backends/postgres/multilock_postgres/_sync",
        {
            "AsyncConnection": "Connection",
            "AsyncCursor": "Cursor",
            "AsyncDeadline": "Deadline",
            "AsyncMutex": "Mutex",
            "AsyncSocketWatch": "SocketWatch",
            "AsyncTicker": "Ticker",
            "AsyncPostgresLease": "PostgresLease",
            "AsyncPostgresLocker": "PostgresLocker",
        },
    ),
    (
        "backends/zookeeper/multilock_zookeeper/_async",
        "backends/zookeeper/multilock_zookeeper/_sync",
        {
            "AsyncZooKeeperLease": "ZooKeeperLease",
            "AsyncZooKeeperLocker": "ZooKeeperLocker",
            "async_settle": "sync_settle",
            "async_stop": "sync_stop",
        },
    ),
]


def _generate(out_root: Path) -> list[tuple[Path, Path]]:
    pairs = []
    for src_dir, dst_dir, extra in RULES:
        replacements = {**COMMON, **extra}
        src = ROOT / src_dir
        for path in sorted(src.rglob("*.py")):
            rel = path.relative_to(src)
            tmp_dst = out_root / dst_dir / rel
            tmp_dst.parent.mkdir(parents=True, exist_ok=True)
            rule = unasync.Rule(str(src), str(out_root / dst_dir), replacements)
            rule._unasync_file(str(path))
            text = tmp_dst.read_text()
            header = (
                "# This file was generated from the async source by scripts/unasync.py:\n"
                f"# {src_dir}/{rel}.\n"
                "# Do not edit it; change the source and rerun the script.\n"
            )
            tmp_dst.write_text(header + text)
            pairs.append((tmp_dst, ROOT / dst_dir / rel))
    if pairs:
        files = [str(p) for p, _ in pairs]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ruff",
                "check",
                "--fix",
                "-q",
                "--config",
                str(ROOT / "pyproject.toml"),
                *files,
            ],
            check=False,
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ruff",
                "format",
                "-q",
                "--config",
                str(ROOT / "pyproject.toml"),
                *files,
            ],
            check=True,
        )
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stale = []
        for generated, target in _generate(Path(tmp)):
            text = generated.read_text()
            if args.check:
                if not target.exists() or target.read_text() != text:
                    stale.append(target.relative_to(ROOT))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
    if stale:
        print("stale generated sync code (run: python scripts/unasync.py):")
        for path in stale:
            print(f"  {path}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
