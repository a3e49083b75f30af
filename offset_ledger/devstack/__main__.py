"""``python -m offset_ledger.devstack fetch|up|down|status|env|jars``."""

from __future__ import annotations

import argparse
import sys
import time

from offset_ledger import devstack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offset_ledger.devstack",
        description="Start and stop the local stack: Apache Kafka (KRaft), PostgreSQL, Spark's Kafka connector.",
    )
    parser.add_argument("command", choices=["fetch", "up", "down", "status", "env", "jars", "topic"],
                        help="jars: print the spark.jars value for the installed PySpark's connector; "
                             "topic NAME: create a topic on the running stack's broker (and produce records)")
    parser.add_argument("name", nargs="?", help="topic: the topic's name")
    parser.add_argument("--user", action="store_true",
                        help="up/env: print the settings a user's job and the CLI read "
                             "(OFFSET_LEDGER_BOOTSTRAP_SERVERS, OFFSET_LEDGER_DSN), not the tests' variables")
    parser.add_argument("--partitions", type=int, default=None, help="topic: partitions of a new topic (default 2)")
    parser.add_argument("--produce", type=int, default=0, metavar="N", help="topic: produce N records")
    args = parser.parse_args(argv)
    if args.command == "topic" and not args.name:
        parser.error("topic needs a NAME")
    try:
        if args.command == "fetch":
            devstack.fetch()
        elif args.command == "jars":
            print(devstack.spark_jars_option())
        elif args.command == "up":
            started = devstack.up()
            for key, value in (user_env(started) if args.user else started.env()).items():
                print(f"export {key}='{value}'")
        elif args.command == "topic":
            info = devstack.status()
            if info is None:
                raise devstack.StackError("no stack running here: python -m offset_ledger.devstack up first")
            print(make_topic(info.bootstrap_servers, args.name, args.partitions, args.produce))
        elif args.command == "down":
            devstack.down()
            print("[devstack] stopped")
        else:
            info = devstack.status()
            if info is None:
                print("[devstack] not running", file=sys.stderr)
                return 1
            if args.command == "status":
                print(f"kafka    {info.bootstrap_servers} (pid {info.kafka_pid})")
                if info.sasl_bootstrap_servers:
                    print(f"  sasl   {info.sasl_bootstrap_servers} (SASL_PLAINTEXT, {devstack.SASL_MECHANISM}, "
                          f"user {devstack.SASL_USERNAME})")
                print(f"postgres {info.postgres_dsn} (pid {info.postgres_pid})")
                print(f"jars     {info.spark_jars}")
            else:
                for key, value in (user_env(info) if args.user else info.env()).items():
                    print(f"export {key}='{value}'")
    except devstack.StackError as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return 2
    return 0


def user_env(info: devstack.StackInfo) -> dict[str, str]:
    """What a job and the CLI read (docs/configuration.md): the broker, and the stack's PostgreSQL as
    the ledger when it runs one (else the embedded SQLite default applies)."""
    out = {"OFFSET_LEDGER_BOOTSTRAP_SERVERS": info.bootstrap_servers}
    if info.postgres_dsn:
        out["OFFSET_LEDGER_DSN"] = info.postgres_dsn
    return out


def make_topic(bootstrap_servers: str, name: str, partitions: int | None, produce: int) -> str:
    """Create ``name`` unless it exists (``partitions``, default 2), produce ``produce`` records
    (``record-1``, ...) round-robin over its partitions; what was done."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    said = []
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=30_000)
    try:
        try:
            admin.create_topics([NewTopic(name, partitions or 2, 1)])
            said.append(f"created topic {name} ({partitions or 2} partitions)")
        except TopicAlreadyExistsError:
            if partitions is not None:
                raise devstack.StackError(f"topic {name} exists already; --partitions only names a new one's")
            said.append(f"topic {name} exists")
        deadline = time.monotonic() + 30
        while not (admin.describe_topics([name]) or [{}])[0].get("partitions"):
            if time.monotonic() > deadline:
                raise devstack.StackError(f"topic {name} did not appear within 30 s")
            time.sleep(0.2)
    finally:
        admin.close()
    if produce:
        producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all")
        try:
            for i in range(produce):
                producer.send(name, f"record-{i + 1}".encode())
            producer.flush()
        finally:
            producer.close()
        said.append(f"produced {produce:,} records")
    return "; ".join(said)


if __name__ == "__main__":
    sys.exit(main())
